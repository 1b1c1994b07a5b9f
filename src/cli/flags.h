// Command-line handling shared by the `torus` subcommands: the parsed command line (Args), the
// flag values with their checks (ports, positive integers, resources, labels), the cluster
// address, and flag checking: every subcommand names the flags it takes, and anything else is
// refused ("unknown flag --adress (did you mean --address?)", exit 2) instead of being ignored.
// Functions that "die" print "torus: <message>" to stderr and exit(1).
// Threading: none of these start threads; ResolveAddress reads the session directory; the rest
// are pure functions of their arguments (and the environment), callable from any thread.
#pragma once

#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/resources.h"
#include "common/status.h"

namespace torus {

// A command line after the subcommand: positional words and --k v / --k=v flags (booleans map
// to "1"), and the words after a lone "--", taken as they are (`torus job submit ... -- CMD`).
struct Args {
  std::vector<std::string> positional;
  std::map<std::string, std::string> flags;
  std::vector<std::string> after_dashes;
  bool Has(const std::string& k) const { return flags.count(k) > 0; }
  std::string Get(const std::string& k, const std::string& def = "") const {
    auto it = flags.find(k);
    return it == flags.end() ? def : it->second;
  }
};

// argv[from..argc) as Args. A flag named in `bool_flags` takes no value; any other takes the
// next word as its value unless written --k=v (or it is the last word: then it is "1"). A lone
// "--" ends the flags: every word after it goes to after_dashes.
Args ParseArgs(int argc, char** argv, int from, const std::set<std::string>& bool_flags);

// Writes "torus: <msg>" to stderr and exits with status 1; a daemon started with --ready-fd
// also reports the message there (common/session_daemons.h).
[[noreturn]] void Die(const std::string& msg);

// A TCP port from a flag (`def` when absent), or death naming the flag.
int PortFlag(const Args& a, const std::string& flag, int def);

// A positive integer (a period in ms, a rate, a count) from a flag, or death naming the flag.
int PositiveIntFlag(const Args& a, const std::string& flag, int def);

// The node's resources from --resources JSON, --num-cpus, --num-gpus and --memory, each checked
// by the one rule (ValidateResources); errors name the flag and the value.
StatusOr<ResourceDoubles> ParseResources(const Args& a);

// --labels "k=v,k2=v2" as a map, checked by ValidateUserLabels.
StatusOr<std::map<std::string, std::string>> ParseLabels(const std::string& s);

// Of heads "A,B,..." (a standby relays to the active head, so any live one serves), the first
// that accepts a connection within 1 s, else the first; a single address as it is.
std::string FirstReachable(const std::string& list);

// The cluster to talk to: --address, else $TORUS_ADDRESS/$RAY_ADDRESS, else the latest session's
// head; of a list, FirstReachable. *from_session tells the last case (a stopped session's head
// means "no cluster").
std::string ResolveAddress(const Args& a, bool* from_session = nullptr);

// The known flag closest to `flag` by edit distance, or "" when none is close (distance > 2,
// or more than a third of the flag's length).
std::string ClosestFlag(const std::string& flag, const std::vector<std::string>& known);

// "" when every key of `given` is in `known`; else the message for the first unknown one.
std::string UnknownFlagMessage(const std::map<std::string, std::string>& given,
                               const std::vector<std::string>& known);

// Writes "torus <command>: <message>" and a help hint to stderr and exits with status 2 when
// `given` has a flag outside `known`; returns otherwise.
void RequireKnownFlags(const std::string& command, const std::map<std::string, std::string>& given,
                       const std::vector<std::string>& known);

}  // namespace torus
