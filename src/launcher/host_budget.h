// How many simulated hosts `torus up` may start on this machine (docs/launcher.md "Host limit").
// Every host of a manifest is a node process on this one machine, with its threads, its memory
// and its object-store arena in /dev/shm: a manifest asking for 10,000 hosts forks node
// processes until fork fails. `up` refuses a plan larger than the limit before it creates a
// session or starts anything.
//
// The limit: --max-hosts N, else $TORUS_MAX_HOSTS, else what the machine has room for: the
// memory available (MemAvailable, or the memory cgroup's room when smaller) over
// kHostMemoryBytes, and the tasks that may still be created (kernel pid and thread limits, the
// pids cgroup, RLIMIT_NPROC for a non-root user) over kHostTasks, whichever is smaller.
//
// Pure functions of their arguments but ReadMachineRoom (which reads /proc and /sys); no
// shared state, callable from any thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace torus::launcher {

// What one simulated host costs, with room for its first worker: an idle node process runs
// ~20 threads in ~22 MiB resident (measured at 33a4de8); a worker adds a process, its threads
// and its memory.
inline constexpr uint64_t kHostMemoryBytes = 128ull << 20;
inline constexpr uint64_t kHostTasks = 100;

// What this machine has room for now.
struct MachineRoom {
  uint64_t memory_bytes = 0;  // memory that new processes may still use
  uint64_t tasks = 0;         // processes and threads that may still be created
};
MachineRoom ReadMachineRoom();

struct HostLimit {
  int64_t max_hosts = 0;
  std::string source;  // "--max-hosts", "TORUS_MAX_HOSTS" or how the default was derived
};

// The limit in force: `flag` (--max-hosts), else `env` (TORUS_MAX_HOSTS), else derived from
// `room` (at least 1). Errors: a flag or variable that is not a positive integer.
StatusOr<HostLimit> ResolveHostLimit(const std::optional<std::string>& flag, const std::optional<std::string>& env,
                                     const MachineRoom& room);

// OK when `hosts` node processes fit the limit; otherwise FailedPrecondition saying how many the
// plan asks for, the limit and where it comes from, and how to allow more.
Status CheckHostCount(size_t hosts, const HostLimit& limit);

}  // namespace torus::launcher
