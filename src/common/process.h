// Launching child processes (daemons, workers) with posix_spawn, safe in threaded parents.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"

namespace torus {

struct SpawnOptions {
  std::vector<std::string> argv;                 // argv[0] is the executable path
  std::map<std::string, std::string> env_set;    // added to / replacing the parent's environment
  std::vector<std::string> env_unset;
  std::string stdout_path;                       // "" = inherit
  std::string stderr_path;                       // "" = inherit; may equal stdout_path
  bool new_session = false;                      // setsid: survive the parent's terminal
  std::string cwd;                               // "" = the parent's working directory
};

StatusOr<pid_t> Spawn(const SpawnOptions& opts);

// "exited with status 1", "killed by signal 9 (SIGKILL)".
std::string DescribeWaitStatus(int status);

// Sleeps until one of a set of children may have exited, another thread calls Wake(), or a
// timeout passes: the reaper loops block here instead of polling waitpid() every few
// milliseconds (at 5 ms, 64 idle node processes woke 13,000 times a second between them).
// Uses a pidfd per child (Linux 5.3+); where one cannot be had, waits at most 5 ms.
// Wait() is for one thread; Wake() for any.
class ChildExitWaiter {
 public:
  ChildExitWaiter();
  ~ChildExitWaiter();
  ChildExitWaiter(const ChildExitWaiter&) = delete;
  ChildExitWaiter& operator=(const ChildExitWaiter&) = delete;

  void Wait(const std::vector<pid_t>& children, int timeout_ms);
  void Wake();

 private:
  int wake_fd_;
  std::unordered_map<pid_t, int> pidfds_;
};

// Absolute path of this process' executable.
std::string SelfExecutable();

}  // namespace torus
