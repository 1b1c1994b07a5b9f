// CopyLarge: memcpy of large values split over a few helper threads (declared in
// include/torus/api/serializer.h). One copy of 100 MiB into the shared-memory arena is bound by
// one core's copy bandwidth; the other cores' share of memory bandwidth is otherwise unused.
#include <algorithm>
#include <cstdlib>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "torus/api/serializer.h"

namespace torus::internal {
namespace {

// Helpers are started on first use and joined at process exit (an atexit handler stops them once
// the copy in progress, if any, is done; a copy asked for after that is a plain memcpy). The pool
// itself is never destroyed, so a late caller still finds a valid object.
class CopyPool {
 public:
  static CopyPool& Instance() {
    static CopyPool* pool = [] {
      auto* p = new CopyPool();
      std::atexit([] { Instance().Stop(); });
      return p;
    }();
    return *pool;
  }

  // Copies [src, src+n) to dst with the caller and the helpers each taking one part.
  void Copy(char* dst, const char* src, size_t n) {
    std::unique_lock<std::mutex> call(call_mu_);  // one parallel copy at a time
    if (stopped_) {
      std::memcpy(dst, src, n);
      return;
    }
    int parts = helpers_ + 1;
    size_t part = (n / parts + 63) & ~size_t{63};
    {
      std::lock_guard<std::mutex> lock(mu_);
      dst_ = dst;
      src_ = src;
      n_ = n;
      part_ = part;
      pending_ = helpers_;
      ++generation_;
    }
    cv_.notify_all();
    std::memcpy(dst, src, std::min(n, part));  // the caller's part: the first
    std::unique_lock<std::mutex> lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
  }

 private:
  CopyPool() {
    unsigned hw = std::thread::hardware_concurrency();
    helpers_ = static_cast<int>(std::clamp(hw, 2u, 4u)) - 1;
    for (int i = 0; i < helpers_; ++i) threads_.emplace_back([this, i] { Loop(i + 1); });
  }
  void Stop() {
    std::lock_guard<std::mutex> call(call_mu_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopped_ = true;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  void Loop(int index) {
    uint64_t seen = 0;
    while (true) {
      char* dst;
      const char* src;
      size_t n, part;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return generation_ != seen || stopped_; });
        if (stopped_) return;
        seen = generation_;
        dst = dst_;
        src = src_;
        n = n_;
        part = part_;
      }
      size_t begin = std::min(n, part * index);
      size_t end = index == helpers_ ? n : std::min(n, begin + part);
      if (end > begin) std::memcpy(dst + begin, src + begin, end - begin);
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ == 0) done_cv_.notify_one();
    }
  }

  std::vector<std::thread> threads_;  // joined by Stop (at exit)
  bool stopped_ = false;              // guarded by mu_ (written also under call_mu_)
  int helpers_ = 0;
  std::mutex call_mu_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint64_t generation_ = 0;
  char* dst_ = nullptr;
  const char* src_ = nullptr;
  size_t n_ = 0, part_ = 0;
  int pending_ = 0;
};

}  // namespace

void CopyLarge(char* dst, const char* src, size_t n) {
  if (n < kParallelCopyMinBytes) {
    std::memcpy(dst, src, n);
    return;
  }
  CopyPool::Instance().Copy(dst, src, n);
}

}  // namespace torus::internal
