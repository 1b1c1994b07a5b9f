// The session directory: one per cluster, holding the token (mode 0600), the head address,
// and one log file per process under logs/. Layout in docs/session.md.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace torus {

// Shortest cluster token accepted anywhere (CreateSession writes 32 hex characters).
inline constexpr size_t kMinTokenLength = 16;

// Root of all sessions: $TORUS_TMPDIR or /tmp/torus.
std::string SessionRoot();
// The root is usable: it does not exist yet, or it is a directory (not a symlink) owned by this
// user that no other user may write to. Otherwise FailedPrecondition saying what is wrong.
Status CheckSessionRoot();
// Creates a new session directory with a fresh token (the root is created 0700 if missing, and
// refused if CheckSessionRoot fails); points <root>/session_latest at it if `make_latest`.
StatusOr<std::string> CreateSession(bool make_latest = true);
// Points <root>/session_latest at `dir` (atomically).
Status MakeLatestSession(const std::string& dir);
// <root>/session_latest resolved: "" when there is none, an error when the root or the link is
// not safe to use (not owned by this user, or writable by others; the message says which).
StatusOr<std::string> FindLatestSession();
// FindLatestSession, with "" for an unsafe root or link too.
std::string LatestSession();
// The head address a session records once its head listens (<session>/head_address, trimmed);
// "" when it has none (yet).
std::string SessionHeadAddress(const std::string& session_dir);
// The latest session's head address: "" when there is no session or it records none; an
// error as FindLatestSession's.
StatusOr<std::string> LatestHeadAddress();
// Token for talking to a cluster: $TORUS_TOKEN, else the token file of `session_dir`
// (or of the latest session when empty), each through CleanToken. Error says where it looked.
StatusOr<std::string> FindToken(const std::string& session_dir = "");
// The token file of a session (<session_dir>/token) through CleanToken.
StatusOr<std::string> ReadTokenFile(const std::string& session_dir);
// The one rule for a cluster token wherever one is read (an environment variable, a token file,
// etcd, Ray's RAY_AUTH_TOKEN): surrounding ASCII whitespace is removed (a Kubernetes secret
// often ends in a newline), then ValidateToken. Every token that reaches gRPC metadata or an
// HTTP header has passed here, so a bad one is refused with a message instead of aborting in
// gRPC.
StatusOr<std::string> CleanToken(std::string_view raw, const std::string& source);
// OK if `token` may serve as a cluster token: at least kMinTokenLength characters, each
// printable ASCII (0x20..0x7e, what gRPC metadata and HTTP headers carry). Else
// kUnauthenticated naming `source` and, for a bad byte, its value and offset, e.g. "the cluster
// token in TORUS_TOKEN contains a control character (byte 0x07 at offset 5); tokens are
// printable ASCII". Messages never contain the token.
Status ValidateToken(std::string_view token, const std::string& source);
// Address of the cluster to join: $TORUS_ADDRESS, $RAY_ADDRESS, else "" (none).
std::string AddressFromEnv();

StatusOr<std::string> ReadFile(const std::string& path);
// Replaces `path` with `content` (mode `mode`) atomically: written to a new file beside it,
// synced, renamed over it, and the directory synced. A failure (a full disk: "no space left on
// device writing PATH", kResourceExhausted) leaves `path` as it was, never empty or half
// written. Every record of a session (token, head_address, pid files, launcher state) is
// written by it. Thread-safe; concurrent writers of one path: the last rename wins.
Status WriteFile(const std::string& path, const std::string& content, int mode = 0644);

}  // namespace torus
