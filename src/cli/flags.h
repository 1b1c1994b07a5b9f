// Flag checking shared by the `torus` subcommands: every subcommand names the flags it takes, and
// anything else is refused ("unknown flag --adress (did you mean --address?)", exit 2) instead
// of being ignored. Pure functions, thread-safe.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace torus {

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
