// Connecting a CLI command to the running cluster: its head address (--address, TORUS_ADDRESS or
// the latest session), the cluster token, and one snapshot of the head's tables.
//
// THREADS: called from the CLI's main thread; Connect exits the process (Die) with a message naming
// what is missing when there is no cluster to talk to.
#pragma once

#include <string>

#include "cli/flags.h"
#include "proto/torus.pb.h"

namespace torus {

struct Cluster {
  std::string address;
  std::string token;
  rpc::ListReply list;  // the head's tables when Connect returned
};

Cluster Connect(const Args& a);

}  // namespace torus
