// The daemons of a session (head, nodes) as the pid files under <session>/pids name them:
// spawning one with its pid file, finding the live ones, stopping them.
//
// Contract: a daemon counts as the session's only when CheckSessionProcess (process.h) says so;
// pid files that are stale are removed silently, pid files naming another process are removed
// and reported (their process is never signalled).
// Threading: plain functions without shared state (but the daemon's report fd, see below); they
// read and write the session directory and may be called from any thread (concurrent callers on
// one session may race on its files).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "common/process.h"
#include "common/status.h"

namespace torus {

// A daemon named by a pid file of a session, checked to be that session's.
struct SessionDaemon {
  std::string file;
  PidRecord rec;
};

// Spawns `argv` in a new session (setsid) with stdout/stderr in <session>/logs/<name>.{out,err}
// and writes <session>/pids/<name>.pid ("PID STARTTIME", PidFileContent). When the pid file
// cannot be written (a full disk), the daemon is killed again and that is the error: a daemon
// without its pid file is one `torus stop` cannot find. `env_set` and
// `env_unset` change the environment it inherits (`torus up` marks its daemons with them).
StatusOr<pid_t> SpawnSessionDaemon(const std::string& session, const std::string& name,
                                   const std::vector<std::string>& argv,
                                   const std::map<std::string, std::string>& env_set = {},
                                   const std::vector<std::string>& env_unset = {});

// ---- How a daemon's start went, told to the command that spawned it (`torus start --head`
// waits for its head so) through a pipe, not through files: a full disk leaves files (its log,
// its head_address) empty, and the command would only see a timeout.

// As SpawnSessionDaemon, with `--ready-fd N` appended to argv: N is the write end of a pipe the
// daemon reports on (ReportDaemonStarted / Die). *report gets the read end (close-on-exec;
// the caller closes it). Not for concurrent use with other spawning threads of this process
// (the write end is inheritable for the moment of the spawn).
StatusOr<pid_t> SpawnReportingSessionDaemon(const std::string& session, const std::string& name,
                                            const std::vector<std::string>& argv, int* report,
                                            const std::map<std::string, std::string>& env_set = {},
                                            const std::vector<std::string>& env_unset = {});

// Waits up to `timeout` for the report of the daemon `pid` on `report`: the payload of its
// "ok" line; its own message (kUnavailable) when it failed; when it exited without a word,
// how it exited and the end of `log`; kDeadlineExceeded when it said nothing in time.
StatusOr<std::string> WaitForDaemonReport(int report, pid_t pid, const std::string& log,
                                          std::chrono::milliseconds timeout);

// The daemon's side. `fd` (its --ready-fd) is made close-on-exec and kept; once the daemon
// serves, ReportDaemonStarted writes "ok <payload>" and closes it; a daemon that cannot start
// reports "error <message>" with ReportDaemonFailed (Die does). Without a fd both do nothing.
// Process-wide; called from the daemon's main thread.
void SetDaemonReportFd(int fd);
void ReportDaemonStarted(const std::string& payload);
void ReportDaemonFailed(const std::string& message);

// Writes <session>/pids/<name>.pid for `pid` ("PID STARTTIME"): the process counts as one of
// the session's daemons (a head or node run in the foreground writes its own).
Status WriteSessionPidFile(const std::string& session, const std::string& name, pid_t pid);

// The live daemons of `session`. Stale pid files (process gone, pid reused) are removed; files
// that hold nonsense or name another process are removed too, and each gets a line in *refused
// ("not signalling anything for <file>: <why>; removed it"); their process is left alone.
std::vector<SessionDaemon> LiveSessionDaemons(const std::string& session, std::vector<std::string>* refused);

// SIGTERM to each daemon, SIGKILL to those still there after `grace` (checked again to be the
// same process first); removes their pid files. Returns how many were signalled.
int TerminateSessionDaemons(const std::vector<SessionDaemon>& daemons, std::chrono::milliseconds grace);

}  // namespace torus
