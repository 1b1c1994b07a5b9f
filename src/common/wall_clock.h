// Wall-clock time since the Unix epoch, for records, listings and traces (job and task times,
// placement-group creation). Durations and deadlines use std::chrono::steady_clock instead.
// THREADS: any thread.
#pragma once

#include <chrono>
#include <cstdint>

namespace torus {

inline int64_t WallClockUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

inline int64_t WallClockMs() { return WallClockUs() / 1000; }

}  // namespace torus
