// The network of a `torus up --netns` cluster (docs/launcher.md): a bridge, one network
// namespace per non-head host joined to it by a veth pair, and the host table
// ("<ip> <fqdn> <name>") each namespace sees as /etc/hosts. Everything is named in the launcher's
// state JSON (written before creation), so `torus down` can remove a half-built setup.
// Also the launcher's `ip` and command helpers.
//
// Threading: plain functions that run commands (`ip`) to completion on the calling thread; they
// write the session's launcher/ and logs/ directories and /etc/netns; no shared state.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/status.h"

namespace torus::launcher {

// `s` without trailing newlines and spaces.
std::string Trim(std::string s);

// The path of the `ip` command (iproute2), or "" when there is none.
std::string IpBinary();

// Runs a command to completion; its output goes to `log` (appended). Error names the command
// and quotes the output.
Status RunCommand(const std::vector<std::string>& argv, const std::string& log);

// The hosts file of the cluster planned in `state` (localhost first, then each host).
std::string HostsTable(const nlohmann::json& state);

// Creates the bridge, one namespace per non-head host with a veth pair into the bridge, and the
// per-namespace hosts files, as `state` names them. Needs root and `ip`.
Status SetUpNetns(const std::string& session, nlohmann::json& state);

// Removes what SetUpNetns created; missing pieces are fine. Returns the namespaces removed.
int TearDownNetns(const std::string& session, const nlohmann::json& state);

// A 10.x.y.0/24 that no local interface uses.
std::string PickSubnet();

}  // namespace torus::launcher
