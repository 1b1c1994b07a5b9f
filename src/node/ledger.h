// Ledger: the node's resource accounting. What the host offers (total), what is free
// (available), the TPU chips not set aside, the GPUs' free shares, and the placement-group
// bundles reserved on this
// node (each with its own total and available). Work takes resources into a Hold (from the node
// or from one bundle) and gives them back with Return — the one rule for "give back what a
// lease or actor held", whether the lease was granted, cancelled while queued, failed to start
// a worker, or its worker died.
//
// Rules kept here:
//  - a Hold that came from a bundle goes back to that bundle; if the bundle was released
//    meanwhile, nothing goes back (the bundle's whole total already went back to the node);
//  - a blocked worker's CPU is lent back to the node while it waits (Block/Unblock), and is
//    not returned twice;
//  - chips go back to the free set exactly once (Return clears the Hold's chips);
//  - GPUs are instances 0..floor(GPU total)-1 of capacity 1 each: a whole request takes whole
//    free instances (lowest ids first), a fractional one (< 1) a share of one instance (the
//    fullest that still has room); work whose GPUs cannot be given so waits, even when the
//    node's GPU total would fit. A Hold's shares go back with it (Ray's GPU ids).
//
// THREADS: not thread-safe. The node owns one Ledger as a member guarded by its mutex; every
// call is made with that mutex held. Pure bookkeeping: no I/O, no logging, no blocking.
#pragma once

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "common/labels.h"
#include "common/resources.h"
#include "common/status.h"
#include "proto/torus.pb.h"

namespace torus {

// What one lease or actor holds of the ledger. Empty (default) holds nothing.
struct Hold {
  ResourceMap res;        // resources taken (from the node, or from the bundle below)
  std::string pg_id;      // non-empty: `res` came from bundle (pg_id, bundle)
  int bundle = -1;
  std::vector<int> chips;  // TPU chips set aside
  std::vector<std::pair<int, ResourceAmount>> gpus;  // GPU instance and the share of it held
  bool blocked = false;    // its CPU is lent back to the node while its worker is blocked
  bool held = false;       // resources were taken (a queued request may not hold yet)
};

class Ledger {
 public:
  struct Bundle {
    ResourceMap total;
    ResourceMap available;
    bool committed = false;
    std::map<std::string, std::string> env;  // for processes started in it (MEGASCALE_*)
    std::vector<std::string> env_unset;
  };
  // Outcome of taking a lease's resources from a placement group's bundles.
  enum class BundleTake {
    kTaken,     // taken into the Hold
    kWait,      // no committed bundle has room now; one could later
    kTooBig,    // no bundle (of those asked for) could ever hold it: wait, but say so
    kMissing,   // the group or the bundle is not on this node: *error says which
  };

  Ledger(std::string node_id, ResourceMap total);
  const std::string& node_id() const { return node_id_; }

  // Resets totals and chips (at Start, once the host's TPU and memory are known): everything
  // is available, no bundle exists.
  void Reset(ResourceMap total, const std::vector<int>& chip_ids);

  const ResourceMap& total() const { return total_; }
  const ResourceMap& available() const { return available_; }
  // Bumped on every change to the bundles (HeartbeatRequest.ledger_seq).
  uint64_t seq() const { return seq_; }

  // Takes `res` (and res["TPU"] chips) from the node's available resources. False, with *h
  // unchanged, when they do not fit.
  bool TakeFromNode(const ResourceMap& res, Hold* h);
  // Takes `res` for a lease from a committed bundle of `pg_id` (`index`, or any when < 0).
  BundleTake TakeFromBundle(const std::string& pg_id, int index, const ResourceMap& res, Hold* h,
                            std::string* error);
  // Takes an actor's resources: from the first bundle of `pg_id` (`index`, or any when < 0)
  // whose available fits them, else, with no group, from the node — where an actor that asks
  // for nothing still needs 1 CPU free to be placed (but holds none). ResourceExhausted when
  // they do not fit.
  Status TakeForActor(const std::string& pg_id, int index, const ResourceMap& res, Hold* h);
  // The GPU instances a hold was given, lowest first (its CUDA_VISIBLE_DEVICES).
  static std::vector<int> GpuIds(const Hold& h);
  // Gives back whatever *h holds (resources, chips and GPU shares) and clears it. Idempotent.
  void Return(Hold* h);
  // A blocked worker lends its CPU back to the node; Unblock takes it again (the node's CPU
  // may go below zero briefly: the task resumes regardless). No-ops when already so.
  void Block(Hold* h);
  void Unblock(Hold* h);

  // Placement-group bundles (two-phase reservation from the head).
  struct BundleSpec {
    int index = 0;
    ResourceMap resources;
    std::map<std::string, std::string> label_selector;
    std::map<std::string, std::string> env;
    std::vector<std::string> env_unset;
  };
  // The bundles a BundlesRequest names.
  static std::vector<BundleSpec> Specs(const rpc::BundlesRequest& req);
  // Reserves (and with `commit`, commits) the bundles, all or none; false with *error when
  // they do not fit or a label selector does not match `labels`. Bundles held already are
  // skipped (a repeated prepare).
  bool Prepare(const std::string& pg_id, const std::vector<BundleSpec>& bundles, bool commit,
               const std::map<std::string, std::string>& labels, std::string* error);
  // Marks the bundles `indices` of `pg_id` committed. False when the group has none here.
  bool Commit(const std::string& pg_id, const std::vector<int>& indices);
  // Releases the bundles `indices` of `pg_id` (all of the group's when empty): their totals go
  // back to the node. Returns the indices released.
  std::vector<int> Release(const std::string& pg_id, const std::vector<int>& indices);
  bool HasGroup(const std::string& pg_id) const { return bundles_.count(pg_id) > 0; }
  const Bundle* FindBundle(const std::string& pg_id, int index) const;
  const std::map<std::string, std::map<int, Bundle>>& bundles() const { return bundles_; }
  // Worker pool key of work in bundle (pg, index): workers started with a bundle's environment
  // serve only work with that same environment.
  std::string BundleEnvKey(const std::string& key, const std::string& pg_id, int index) const;

  // The ledger part of a PrepareBundlesReply (available, ledger_seq).
  void FillReply(rpc::PrepareBundlesReply* reply) const;
  // The serialised PrepareBundlesReply {ok, error, the ledger} appended to *out, without
  // building the message (the lane's hot path).
  void AppendReply(bool ok, const std::string& error, std::string* out) const;

 private:
  std::vector<int> TakeChips(const ResourceMap& res);
  // The GPU shares `res` would get (empty when it asks for no GPU), or false when its GPUs
  // cannot be given now.
  bool PickGpus(const ResourceMap& res, std::vector<std::pair<int, ResourceAmount>>* out) const;
  // Moves `res` from *from (the node's or a bundle's available) into *h, with its chips.
  void Take(ResourceMap* from, const ResourceMap& res, const std::string& pg_id, int bundle, Hold* h);

  const std::string node_id_;
  ResourceMap total_;
  ResourceMap available_;
  std::set<int> free_chips_;
  std::vector<ResourceAmount> gpu_free_;  // per GPU instance: the share not held
  std::map<std::string, std::map<int, Bundle>> bundles_;  // pg id -> index -> state
  uint64_t seq_ = 0;
};

}  // namespace torus
