// What the benchmarks driven by bench/gang_bench.sh share: timing an operation and printing one
// JSON line per measurement, e.g.
//   {"name": "pg_create_latency_64_bundles", "median_us": 812.0, "p10_us": 701.3, "p90_us": 990.1, "n": 200}
// (gang_bench.sh and bench/results read these fields by name.)
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

namespace torus::bench {

using Clock = std::chrono::steady_clock;

// Prints the median, 10th and 90th percentiles of `us` (microseconds) as one JSON line.
inline void Report(const std::string& name, std::vector<double> us) {
  if (us.empty()) return;
  std::sort(us.begin(), us.end());
  auto q = [&](double p) { return us[std::min(us.size() - 1, static_cast<size_t>(p * us.size()))]; };
  printf("{\"name\": \"%s\", \"median_us\": %.1f, \"p10_us\": %.1f, \"p90_us\": %.1f, \"n\": %zu}\n",
         name.c_str(), q(0.5), q(0.1), q(0.9), us.size());
  fflush(stdout);
}

// Times `op` `iters` times (after 3 untimed warm-ups), in microseconds.
inline std::vector<double> Time(int iters, const std::function<void()>& op) {
  for (int i = 0; i < 3; ++i) op();
  std::vector<double> us;
  for (int i = 0; i < iters; ++i) {
    auto t0 = Clock::now();
    op();
    us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  }
  return us;
}

}  // namespace torus::bench
