// The processes of a cluster started by `torus up` (docs/launcher.md): each carries
// TORUS_UP_SESSION=<session dir> in its environment (kMarkerVar), by which `down` finds them
// after any crash.
//
// Threading: plain functions reading /proc, /dev/shm and the session directory, and signalling
// processes; no shared state, callable from any thread. TerminateAll blocks for up to its grace
// period plus one second.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <set>
#include <string>
#include <vector>

namespace torus::launcher {

inline constexpr const char* kMarkerVar = "TORUS_UP_SESSION";

// "TORUS_UP_SESSION=<session>".
std::string Marker(const std::string& session);

// `pid` exists and is not a zombie.
bool Alive(pid_t pid);

// The NUL-separated initial environment of a process contains `entry` ("K=V").
bool HasEnvEntry(pid_t pid, const std::string& entry);

// Live processes (not this one) whose initial environment contains `entry` ("K=V").
std::vector<pid_t> ProcessesWithEnv(const std::string& entry);

// Live processes (not this one) started for the cluster of `session`.
std::vector<pid_t> SessionProcesses(const std::string& session);

// The pid in a pid file ("PID STARTTIME" as PidFileContent writes, or "PID" as `torus up`
// wrote before), or 0.
pid_t ReadPid(const std::string& path);

// Shared-memory prefixes ("torus.<id12>.") of every node `session` ever ran: from the node
// logs ("node <id> listening on ...") and from the mappings of the live processes `pids`.
std::set<std::string> ShmPrefixes(const std::string& session, const std::vector<pid_t>& pids);

// Whether anything of `session` is left for `down` to remove: its processes, pid files, owner
// locks of node segments (<session>/shm), segments of its nodes. A failed launch is marked down
// by its own cleanup, but a node still dying then leaves its segments: `down` must see them.
bool HasLeftovers(const std::string& session);

// SIGTERM, then SIGKILL after `grace`. Returns how many were alive at the start.
int TerminateAll(const std::vector<pid_t>& pids, std::chrono::milliseconds grace);

}  // namespace torus::launcher
