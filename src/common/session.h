// The session directory: one per cluster, holding the token (mode 0600), the head address,
// and one log file per process under logs/. Layout in docs/session.md.
#pragma once

#include <string>

#include "common/status.h"

namespace torus {

// Root of all sessions: $TORUS_TMPDIR or /tmp/torus.
std::string SessionRoot();
// Creates a new session directory with a fresh token; points <root>/session_latest at it.
StatusOr<std::string> CreateSession(bool make_latest = true);
// <root>/session_latest resolved, or "" when there is none.
std::string LatestSession();
// Token for talking to a cluster: $TORUS_TOKEN, else the token file of `session_dir`
// (or of the latest session when empty). Error says where it looked.
StatusOr<std::string> FindToken(const std::string& session_dir = "");
// Address of the cluster to join: $TORUS_ADDRESS, $RAY_ADDRESS, else "" (none).
std::string AddressFromEnv();

StatusOr<std::string> ReadFile(const std::string& path);
Status WriteFile(const std::string& path, const std::string& content, int mode = 0644);

}  // namespace torus
