// Launching child processes (daemons, workers) with posix_spawn, safe in threaded parents.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
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

// Absolute path of this process' executable.
std::string SelfExecutable();

}  // namespace torus
