// `torus start --head` and a session's durable head state (docs/fault_tolerance.md): which
// session a new head serves. The latest session is resumed when it has durable state and no
// live head; --session-dir DIR names another session to resume; --new-session starts afresh
// after saying what it abandons (and stopping that session's remaining daemons, which could not
// join a new session).
//
// Threading: plain functions, run by the CLI's main thread.
#pragma once

#include <string>

#include "cli/flags.h"
#include "common/status.h"

namespace torus {

// "3 actors, 1 placement group, 0 jobs, 0 drivers, 12 KV keys": what the durable state of
// `session` holds, "" when it has none (no state file, or an empty one), or why it cannot be read.
StatusOr<std::string> DurableStateSummary(const std::string& session);

// `torus stop` ended the session (its workers and actors are gone): its durable state is not
// resumed. Marks it with <session>/ended when it has durable state.
void MarkSessionEnded(const std::string& session);

// The session the head started by `a` resumes, or "" for a new session. Prints what it decides
// (to stderr). Errors: --session-dir naming a directory without durable state, or with a live head.
StatusOr<std::string> ChooseHeadSession(const Args& a);

// Whether `session` can be resumed by the head `a` starts on `port`: the session's nodes and
// drivers reconnect to its head's old address, so the port must be the same; with --block no
// daemon of the session may still run (the head would start a second node beside it).
Status CheckResume(const Args& a, const std::string& session, const std::string& port);

}  // namespace torus
