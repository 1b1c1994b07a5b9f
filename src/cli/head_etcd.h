// The daemon of a head on etcd (`torus start --head --state etcd://HOST:PORT[/prefix]`,
// docs/fault_tolerance.md "Standby heads"): campaign, stand by relaying to the active head, then
// serve. (`torus start`'s side is in cli/start.cc.)
//
// THREADS: the daemon's main thread campaigns, then waits for the head; a SignalThread stops
// either; the election's renewal thread (head/head_election.h) ends the process when the
// leadership is lost; the relay (common/tcp_relay.h) owns its thread while standing by.
#pragma once

#include <signal.h>

#include <string>

#include "cli/flags.h"
#include "head/head.h"

namespace torus {

// The daemon: `cfg` is the head's configuration from its flags (state_path is the etcd URL).
int RunHeadOnEtcd(const Args& a, HeadConfig cfg, const sigset_t& signals);

// <session>/head_<port>.state, written by the daemon: "standby <active address>" or "active".
std::string HeadStateFile(const std::string& session, int port);

}  // namespace torus
