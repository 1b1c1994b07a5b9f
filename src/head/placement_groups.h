// PlacementGroupManager: the head's placement groups and slice reservations
// (docs/placement_groups.md, docs/tpu.md section 6): the table of groups, the queue of groups
// waiting to be placed, the choice of nodes (head/placement.h) or whole idle slices (the
// head's SliceIndex), the bundle calls that reserve them on the nodes (head/bundle_calls.h),
// and what happens to groups when a node is lost or the job that made them finishes.
//
// It shares the head's mutex (`mu`, given at construction), because a group's state changes
// together with node and actor state (a group lost with its node; actors dying with their
// group). The rest of the head reaches nodes and actors only through PgCluster.
//
// THREADS
//  - gRPC / lane handler threads call Create, Remove and Get without holding mu.
//  - the head's handler and monitor threads call the methods marked REQUIRES(mu_) with mu held.
//  - one scheduler thread (Start/Stop) places groups one at a time in arrival order; a Create
//    that finds the queue empty places its group on the caller's thread instead. Either
//    releases mu while calling nodes (`scheduling_` marks that one group is in flight).
//  - releases that no caller waits for (a lost node, a finished job) run on the head's
//    WorkQueue (given at construction), which the head drains after Stop.
// Every member below `mu_` is guarded by it.
#pragma once

#include <chrono>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "common/labels.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "head/bundle_calls.h"
#include "head/head_store.h"
#include "head/placement.h"
#include "head/slice_index.h"
#include "common/work_queue.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

// What the placement-group manager needs from the rest of the head. Every method is called
// with the head's mutex held, from whichever thread holds it.
class PgCluster {
 public:
  virtual ~PgCluster() = default;
  // The cluster view's version: it changes whenever a node joins, leaves or its resources change.
  virtual uint64_t ViewVersion() = 0;
  // The alive nodes, indexed for placement decisions.
  virtual const PlacementIndex& Placement() = 0;
  // Whether node `node_id` is known and its labels match `selector`.
  virtual bool NodeMatches(const LabelSelectorTerms& selector, const std::string& node_id) = 0;
  // The node's address ("" when unknown).
  virtual std::string NodeAddress(const std::string& node_id) = 0;
  virtual const SliceIndex& Slices() = 0;
  // Takes the ledger of the node `call` went to from its reply, unless the head holds a newer
  // one or the node at call.node_id is no longer at call.address.
  virtual void ApplyLedger(const NodeCall& call, const BundleReply& reply) = 0;
  // A group was granted: the view changed and its actors may be placed now.
  virtual void OnPgCreated() = 0;
  // Group `pg_id` was removed (`why`): the actors in it die.
  virtual void OnPgRemoved(const std::string& pg_id, const std::string& why) = 0;
  // A slice of group `pg_id` was lost: the workers of its alive actors are killed.
  virtual void OnPgSliceLost(const std::string& pg_id) = 0;
};

// One placement group as the manager keeps it.
struct PgEntry {
  using Clock = std::chrono::steady_clock;
  rpc::PlacementGroupRecord rec;
  std::vector<LabelSelectorTerms> selectors;  // per bundle
  Clock::time_point pending_since;
  bool scheduling = false;  // its bundles are being reserved on nodes (mu released meanwhile)
  uint64_t tried_view = 0;  // view version of the last failed attempt
  // After a failed prepare: try again from then on even if the view has not changed.
  Clock::time_point retry_at = Clock::time_point::max();
  bool feasible = true;  // could be placed on the cluster's totals
  Clock::time_point deadline = Clock::time_point::max();
};

// A group as requested (`req`, from a client), checked and normalised: bundle indexes set,
// placements cleared, selectors parsed, the slice request turned into its shape; the id the
// caller minted checked (none: the head mints one), no state yet. InvalidArgument with the message the client sees when the request is wrong. `now` starts
// a slice request's timeout. Pure.
StatusOr<PgEntry> ParsePgRequest(const rpc::PlacementGroupRecord& req, PgEntry::Clock::time_point now);

class PlacementGroupManager {
 public:
  // `stray_grace`: how long a bundle a node holds but this head does not record there is left
  // alone before it is released (ReconcileNodeLocked).
  PlacementGroupManager(Mutex& mu, PgCluster& cluster, WorkQueue& pool, std::string token,
                        std::chrono::milliseconds stray_grace);
  ~PlacementGroupManager();
  PlacementGroupManager(const PlacementGroupManager&) = delete;
  PlacementGroupManager& operator=(const PlacementGroupManager&) = delete;

  void Start() EXCLUDES(mu_);  // starts the scheduler thread
  void Stop() EXCLUDES(mu_);   // stops and joins it; waiters in Get return. Idempotent.

  // The rpc::Head placement-group calls (the token already checked).
  grpc::Status Create(const rpc::PlacementGroupRecord& req, rpc::CreatePlacementGroupReply* reply)
      EXCLUDES(mu_);
  // Synchronous: when it returns, the group's resources are free on the nodes and in the view.
  grpc::Status Remove(const rpc::PlacementGroupRequest& req) EXCLUDES(mu_);
  grpc::Status Get(grpc::ServerContext* ctx, const rpc::PlacementGroupRequest& req,
                   rpc::GetPlacementGroupReply* reply) EXCLUDES(mu_);

  // The group's record; nullptr when unknown (or forgotten long after its removal).
  const rpc::PlacementGroupRecord* Find(const std::string& pg_id) const REQUIRES(mu_);
  // The reservation holding slice `slice` ("" when none).
  std::string HolderOf(const std::string& slice) const REQUIRES(mu_);
  void AppendTo(rpc::ListReply* reply) const REQUIRES(mu_);
  // Node `node_id` is gone: groups with bundles there are rescheduled (a slice reservation
  // loses and releases the whole slice).
  void OnNodeLost(const std::string& node_id) REQUIRES(mu_);
  // Durable state (head/head_store.h): every change to a group is written to `store` (null:
  // memory only) before the call that made it returns; a removed group is deleted from it.
  // Set once, before serving.
  void AttachStore(HeadStore* store) { store_ = store; }
  // A resumed head: the groups of `records` (kPlacementGroup values) as they were, with the
  // nodes of their bundles and the slices they hold; waiting ones queue again. Returns how many,
  // or an error for a garbled record (then nothing is taken).
  StatusOr<size_t> RestoreLocked(const std::vector<std::pair<std::string, std::string>>& records) REQUIRES(mu_);
  // Node `node_id` at `node_address` registered holding the bundles `held`. Reconciles both
  // ways (docs/fault_tolerance.md, "Reconciling bundles"): a CREATED or RESCHEDULING group's
  // bundles recorded on this node but not held there are lost: the group reschedules them
  // (RESCHEDULING until re-placed) — unless `held_is_stale` (the head has seen a newer ledger of
  // this very node process than the list). A bundle held there that no live group records there
  // (a group this head never knew, e.g. a state restored from an older copy; removed; or placed
  // elsewhere) is a stray: released once it has stayed one for the stray grace
  // (ReleaseStrayBundlesLocked), so that a grant in flight is never undone.
  void ReconcileNodeLocked(const std::string& node_id, const std::string& node_address,
                           const google::protobuf::RepeatedPtrField<rpc::HeldBundles>& held,
                           bool held_is_stale) REQUIRES(mu_);
  // Releases the strays that are still strays after the grace (the head's monitor, each tick).
  void ReleaseStrayBundlesLocked(PgEntry::Clock::time_point now) REQUIRES(mu_);
  // The node ids the bundles of live groups are on.
  std::set<std::string> NodesInUseLocked() const REQUIRES(mu_);
  // The non-detached groups of a finished job are removed.
  void RemoveJobGroups(const std::string& job_id) REQUIRES(mu_);
  // The view changed: waiting groups are tried again.
  void Wake() REQUIRES(mu_) { sched_cv_.NotifyAll(); }
  // For the head, which holds the same mutex under its own name: tells clang's analysis that
  // it is held (no run-time effect).
  void AssertHeld() const ASSERT_CAPABILITY(mu_) {}

 private:
  using Clock = PgEntry::Clock;
  // One group being granted: the new bundles by node, and the reserve call per node.
  struct Grant {
    std::string pg_id;
    std::map<std::string, std::vector<int>> by_node;  // node address -> bundle indexes
    std::map<std::string, std::string> node_of_addr;   // node address -> node id
    std::vector<NodeCall> calls;
  };
  enum class Try { kPlaced, kSkip, kBlock };

  void Loop() EXCLUDES(mu_);  // the scheduler thread
  // Places the first placeable group in the queue, releasing mu while calling nodes (the
  // caller's MutexLock stays valid: mu is held again on return); false when none can be
  // placed now. Requires !scheduling_.
  bool ScheduleOnce() REQUIRES(mu_);
  // The first group in arrival order that can be placed on the current view, with the node id
  // per bundle; nullptr when none. A group that could fit an idle cluster but has waited longer
  // than kAging blocks the groups behind it, so small groups cannot starve a large one.
  PgEntry* ChooseNext(std::vector<std::string>* placed_ids) REQUIRES(mu_);
  Try TryPlace(PgEntry& e, std::vector<std::string>* placed_ids) REQUIRES(mu_);
  Try TryPlaceSlices(PgEntry& e, std::vector<std::string>* placed_ids) REQUIRES(mu_);
  Try TryPlaceBundles(PgEntry& e, bool aged, std::vector<std::string>* placed_ids) REQUIRES(mu_);
  // Node id per bundle for a slice reservation, choosing whole idle slices for the slice
  // indices not granted yet; fills *slice_names.
  std::optional<std::vector<std::string>> PlaceSlices(PgEntry& e, std::vector<std::string>* slice_names,
                                                      std::string* reason) REQUIRES(mu_);
  // MEGASCALE_* environment of each bundle of a slice reservation being granted (tpu::MegascaleEnv).
  void SetSliceEnv(PgEntry& e, const std::vector<std::string>& placed_ids) REQUIRES(mu_);
  Grant BeginGrant(PgEntry& e, const std::vector<std::string>& placed_ids) REQUIRES(mu_);
  // Reserves on every node at once; if any refused, rolls back those that reserved. Returns
  // the first failure ("" when all reserved). No lock held.
  std::string ReserveOnNodes(const Grant& g, std::vector<BundleReply>* results,
                             std::vector<size_t>* answered) EXCLUDES(mu_);
  void FinishGrant(const Grant& g, const std::string& failure) REQUIRES(mu_);  // may release mu meanwhile
  void GrantFailed(PgEntry& e, const std::string& failure) REQUIRES(mu_);
  // Gives back the slices of a slice reservation's indices that have no bundle placed.
  void DropUngrantedSlicesLocked(PgEntry& e) REQUIRES(mu_);
  // Marks a group REMOVED; returns the releases of its placed bundles.
  std::vector<NodeCall> RemoveLocked(PgEntry& e, const std::string& why) REQUIRES(mu_);
  // Which of a group's bundles on a node are gone: all of them (the node died), or those the node
  // does not hold (ReconcileNodeLocked).
  using LostBundle = std::function<bool(const PgEntry& e, int index)>;
  // The groups with bundles on `node_id` that `lost` selects reschedule them.
  void LoseBundlesLocked(const std::string& node_id, const LostBundle& lost) REQUIRES(mu_);
  void OnSliceNodeLost(PgEntry& e, const std::string& node_id, const LostBundle& lost,
                       std::vector<NodeCall>* release) REQUIRES(mu_);
  // Whether a live group records bundle `index` of `pg_id` on node `node_id`.
  bool RecordedOnLocked(const std::string& pg_id, int index, const std::string& node_id) const REQUIRES(mu_);
  void Reschedule(PgEntry& e) REQUIRES(mu_);  // CREATED -> RESCHEDULING, first in the queue
  // Releases bundles on nodes, all at once, and takes their ledgers.
  void ReleaseOnNodes(const std::vector<NodeCall>& what) EXCLUDES(mu_);
  void ReleaseInBackground(std::vector<NodeCall> what) REQUIRES(mu_);
  void TrimRemovedLocked() REQUIRES(mu_);
  // Writes the group to the store, or deletes it once REMOVED (no-op without a store).
  void SaveLocked(const PgEntry& e) REQUIRES(mu_);
  HeadStore* store_ = nullptr;  // set before serving

  static constexpr auto kAging = std::chrono::seconds(1);
  // REMOVED groups kept for queries; the oldest are forgotten beyond this.
  static constexpr size_t kKeepRemovedPgs = 1000;

  // constant after construction
  Mutex& mu_;
  PgCluster& cluster_;
  WorkQueue& pool_;
  const std::string token_;
  const std::chrono::milliseconds stray_grace_;

  // guarded by mu_
  CondVar sched_cv_;  // the view changed, or a group is waiting
  CondVar state_cv_;  // a group became CREATED or REMOVED
  std::map<std::string, PgEntry> pgs_ GUARDED_BY(mu_);
  std::deque<std::string> queue_ GUARDED_BY(mu_);  // PENDING / RESCHEDULING groups, arrival order
  // REMOVED groups in removal order: the oldest are forgotten beyond kKeepRemovedPgs, so a head
  // serving reservations for weeks does not grow with every one it ever made.
  std::deque<std::string> removed_ GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, std::string> named_ GUARDED_BY(mu_);  // (ns, name) -> id
  std::map<std::string, std::string> slice_holder_ GUARDED_BY(mu_);  // slice name -> reservation id
  // Bundles nodes hold that no live group records there, by (node id, group id, index): the
  // node's address and since when (ReconcileNodeLocked, ReleaseStrayBundlesLocked).
  struct StrayBundle {
    std::string address;
    Clock::time_point since;
  };
  std::map<std::tuple<std::string, std::string, int>, StrayBundle> strays_ GUARDED_BY(mu_);
  bool scheduling_ GUARDED_BY(mu_) = false;  // a group is being reserved (mu released meanwhile)
  bool stopping_ GUARDED_BY(mu_) = false;

  std::thread thread_;  // the scheduler; started by Start, joined by Stop
};

}  // namespace torus
