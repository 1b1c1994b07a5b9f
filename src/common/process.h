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

// ---- Pid files of daemons (<session>/pids/*.pid): "PID STARTTIME\n", STARTTIME being field 22
// of /proc/PID/stat (clock ticks after boot), which tells a recycled pid from the daemon's.
// Files holding only "PID" (older versions, also of `torus up`) are read too. Thread-safe.

// Field 22 of /proc/PID/stat, or 0 when the process is gone.
uint64_t ProcessStartTime(pid_t pid);
// What a pid file of `pid` holds.
std::string PidFileContent(pid_t pid);

struct PidRecord {
  pid_t pid = 0;
  uint64_t start_time = 0;  // 0: not recorded
};
// Refuses anything but "PID [STARTTIME]" with PID > 1 (no "-1", "0", "1", words, extra fields).
StatusOr<PidRecord> ParsePidFile(const std::string& content);

enum class PidState {
  kSessionDaemon,  // alive, started at the recorded time, its argv has --session-dir <session>
  kGone,           // no such process (or a zombie): the pid file is stale
  kOther,          // alive but another process: never to be signalled
};
// What the process of `rec` is with respect to the session directory `session_dir`; *why says
// why it is not that session's daemon.
PidState CheckSessionProcess(const PidRecord& rec, const std::string& session_dir, std::string* why);

}  // namespace torus
