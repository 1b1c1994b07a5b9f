// The other nodes of the cluster as the head last described them to this node (heartbeat views:
// whole snapshots and deltas of the nodes that changed), kept as compact entries
// (common/node_table.h) in a placement index (common/placement_index.h), so that choosing where
// to spill a lease request back reads a few candidates instead of every node: at 10,000 nodes a
// decision is still microseconds.
//
// Choice (the index's candidate order): the node with the most of the request's key resource
// free (its scarcest resource; CPU for most tasks), among those whose labels match; this node is
// never a candidate.
// Thread-compatible: the lease scheduler guards it with its mutex.
#pragma once

#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/labels.h"
#include "common/node_table.h"
#include "common/placement_index.h"
#include "common/resources.h"
#include "proto/torus.pb.h"

namespace torus {

class PeerView {
 public:
  explicit PeerView(std::string self_id) : self_(std::move(self_id)) {}
  PeerView(const PeerView&) = delete;
  PeerView& operator=(const PeerView&) = delete;

  // The whole view: nodes not in it are dropped.
  void ApplySnapshot(const rpc::ListReply& snapshot);
  // The nodes that changed (reply.nodes()) and those gone (reply.removed_node_ids()).
  void ApplyDelta(const rpc::HeartbeatReply& reply);

  struct Target {
    std::string node_id, address;
  };
  // Another node for a request: the first candidate that can run it now; else, with
  // `or_capacity`, the first whose totals could.
  std::optional<Target> Pick(const ResourceMap& res, const LabelSelectorTerms& selector, bool or_capacity) const;
  // For SPREAD: the first candidate that can run the request now when it has more room for it
  // than `local` (this node's available resources) has; room is how many such requests fit
  // (the least over the request's resources).
  std::optional<Target> PickRoomier(const ResourceMap& res, const LabelSelectorTerms& selector,
                                    const ResourceMap& local) const;
  // Whether another node's totals could ever hold the request.
  bool AnyCouldFit(const ResourceMap& res, const LabelSelectorTerms& selector) const;
  // Takes `res` off the node's available resources for kChargeHold, also across the head's
  // views of it meanwhile (a view in flight describes the node before the lease sent there was
  // granted), so that a burst of spillbacks spreads out.
  void Charge(const std::string& node_id, const ResourceMap& res);
  // Longer than a node's heartbeat (100 ms) plus the head's view reaching this node (one more).
  static constexpr std::chrono::milliseconds kChargeHold{500};
  size_t size() const { return index_.size(); }

 private:
  void Put(const rpc::NodeRecord& rec);  // indexes it (alive), or drops it
  void Drop(const std::string& id);

  struct HeldCharge {
    ResourceMap res;
    std::chrono::steady_clock::time_point until;
  };

  const std::string self_;
  std::map<std::string, std::vector<HeldCharge>> charges_;  // by node id (Charge)
  NamePool names_;
  size_t totals_live_ = 0;  // names_'s totals after the last SweepTotals
  std::map<std::string, NodeEntry> nodes_;  // keys and entries stay put while indexed
  PlacementIndex index_{names_, [this](std::string_view id) -> const NodeEntry* {
    auto it = nodes_.find(std::string(id));
    return it == nodes_.end() ? nullptr : &it->second;
  }};
};

}  // namespace torus
