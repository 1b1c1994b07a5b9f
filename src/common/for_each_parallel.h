// ForEachParallel: one blocking call per item, at most `width` running at a time, results in the
// items' order. For fan-out calls of the CLI and one-off cluster queries (asking every node or
// worker once), not for hot paths: each call gets its own short-lived thread.
//
// THREADS: blocks the caller until every call returned; `call` runs on other threads and must be
// safe to run concurrently with itself.
#pragma once

#include <algorithm>
#include <future>
#include <vector>

namespace torus {

template <class R, class T, class F>
std::vector<R> ForEachParallel(const std::vector<T>& items, F call, size_t width = 16) {
  std::vector<R> out;
  out.reserve(items.size());
  width = std::max<size_t>(width, 1);
  for (size_t i = 0; i < items.size(); i += width) {
    std::vector<std::future<R>> batch;
    for (size_t j = i; j < std::min(items.size(), i + width); ++j) {
      batch.push_back(std::async(std::launch::async, call, std::cref(items[j])));
    }
    for (auto& f : batch) out.push_back(f.get());
  }
  return out;
}

}  // namespace torus
