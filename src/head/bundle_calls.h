// The head's calls to nodes about placement-group bundles (docs/placement_groups.md, docs/wire.md):
// the requests written straight from a group's record, the replies read by hand, and one
// concurrent round of calls to many nodes (over the lane where a node has one, over gRPC
// otherwise, directly to a node in this process).
//
// A group's bundles are reserved and committed in one step (PrepareBundles with commit set):
// no task or actor can use a bundle before the head marks the group CREATED, so the head's
// CREATED is the commit point and there is no separate commit round.
//
// Threading: free functions without shared state; CallNodes blocks the calling thread until
// every call is answered or its 5 s deadline passed. Call them without the head's lock.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/resources.h"
#include "proto/torus.pb.h"

namespace torus {

// A node's answer to a bundle call: the call's status and, when that is OK, the
// rpc::PrepareBundlesReply read by hand from its bytes (no protobuf map built per reply).
struct BundleReply {
  grpc::Status status;
  bool ok = false;
  std::string error;
  uint64_t ledger_seq = 0;
  std::string raw;  // the serialised reply
  struct Amount {
    uint32_t name_offset = 0, name_size = 0;  // the resource name, in `raw`
    int64_t units = 0;                        // ResourceAmount units (1/10,000)
  };
  std::vector<Amount> available;
  std::string_view Name(const Amount& a) const {
    return std::string_view(raw).substr(a.name_offset, a.name_size);
  }
};

// One bundle call to one node: its id (whose ledger the reply carries; "" when unknown, and
// the ledger then waits for the node's next heartbeat), its address and the serialised
// rpc::BundlesRequest.
struct NodeCall {
  std::string node_id;
  std::string address;
  std::string payload;
};

enum class BundleOp { kPrepare, kRelease };

// A serialised rpc::BundlesRequest for `rec`'s group with its bundles `which`, each exactly as
// in the record (resources, label selector, environment), reserved and committed at once.
std::string BundlesPayload(const rpc::PlacementGroupRecord& rec, const std::vector<int>& which);
// A serialised rpc::BundlesRequest releasing bundles by index (a release needs nothing else).
std::string ReleasePayload(const std::string& pg_id, const std::vector<int>& indexes,
                           const std::string& reason);
// Reads r->raw (a serialised rpc::PrepareBundlesReply) into r's fields; false if garbled.
bool ParseBundleReply(BundleReply* r);
// The request `c` sends: its payload, addressed to c.node_id when that is known.
std::string AddressedPayload(const NodeCall& c);
// One bundle call per NodeCall, issued concurrently; results in order of `calls`.
std::vector<BundleReply> CallNodes(const std::string& token, BundleOp op,
                                   const std::vector<NodeCall>& calls);

}  // namespace torus
