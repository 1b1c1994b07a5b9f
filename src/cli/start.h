// `torus start` / `torus stop` and the daemons they spawn (`torus head`, `torus node`):
// cluster lifecycle on this host (docs/cli.md).
//
// THREADS (daemons): main blocks SIGINT/SIGTERM before any thread starts (BlockSignals); a
// SignalThread (cli/daemon_threads.h) waits for them with sigwait() and stops the head/node,
// whose objects own their threads (see head.h, node.h); the head also runs a MallocTrimmer.
// `start --head --block` waits in sigwait() on the main thread itself.
#pragma once

#include <signal.h>

#include <set>
#include <string>
#include <vector>

#include "cli/flags.h"
#include "common/status.h"

namespace torus {

// The flags that take no value, for ParseArgs.
extern const std::set<std::string> kBoolFlags;
// The flags `torus start` takes.
std::vector<std::string> StartFlags();

void BlockSignals(sigset_t* set);
class Head;
// Writes what a started head serves on into its session (<session>/dashboard_address, then
// head_address: the CLI reads them; nothing when `session` is ""), then tells the command that
// started this daemon (--ready-fd, common/session_daemons.h) its address. Errors: a record
// that could not be written ("no space left on device writing PATH"); the old ones are kept.
[[nodiscard]] Status WriteHeadAddresses(const Head& head, const std::string& session);
int RunHead(const Args& a);  // `torus head` (a daemon)
int RunNode(const Args& a);  // `torus node` (a daemon)
int Start(const Args& a);
int Stop(const Args& a);

}  // namespace torus
