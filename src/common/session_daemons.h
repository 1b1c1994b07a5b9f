// The daemons of a session (head, nodes) as the pid files under <session>/pids name them:
// spawning one with its pid file, finding the live ones, stopping them.
//
// Contract: a daemon counts as the session's only when CheckSessionProcess (process.h) says so;
// pid files that are stale are removed silently, pid files naming another process are removed
// and reported (their process is never signalled).
// Threading: plain functions without shared state; they read and write the session directory
// and may be called from any thread (concurrent callers on one session may race on its files).
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
// and writes <session>/pids/<name>.pid ("PID STARTTIME", PidFileContent). `env_set` and
// `env_unset` change the environment it inherits (`torus up` marks its daemons with them).
StatusOr<pid_t> SpawnSessionDaemon(const std::string& session, const std::string& name,
                                   const std::vector<std::string>& argv,
                                   const std::map<std::string, std::string>& env_set = {},
                                   const std::vector<std::string>& env_unset = {});

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
