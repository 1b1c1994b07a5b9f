// ActorDirectory: the head's actors (docs/architecture.md, "Path of an actor", "Failure
// handling"): their records and states (PENDING, ALIVE, RESTARTING, DEAD), names per
// namespace, placement (the least-loaded alive node by free CPU among those whose available
// resources fit and whose labels match, or the node of the actor's placement-group bundle),
// the Node.StartActor call that runs the constructor, restarts after a worker or node death
// while max_restarts allows, kills, and the deaths that come with a finished job or a removed
// placement group.
//
// It shares the head's mutex (`mu`, given at construction), because an actor's state changes
// together with node and placement-group state (a node's death restarts its actors; a group's
// removal kills them). It reads the node table through ActorNodes and the groups through the
// PlacementGroupManager.
//
// THREADS
//  - gRPC handler threads call Create, WorkerDied, Get (which may wait on cv_ up to
//    wait_alive_ms, in 200 ms steps to notice a cancelled caller) and Kill without holding mu.
//  - the head's handler and monitor threads call the methods marked REQUIRES(mu_) with mu held.
//  - each placement attempt runs on the head's WorkQueue (given at construction): it calls
//    Node.StartActor without mu (blocking while the node starts a worker and runs the
//    constructor), then records the outcome under mu. Worker kills go there too. Stop()
//    cancels the StartActor calls in flight; the head drains the queue after it.
// Every member below `mu_` is guarded by it.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "common/labels.h"
#include "common/resources.h"
#include "common/thread_annotations.h"
#include "common/work_queue.h"
#include "common/placement_index.h"
#include "head/head_store.h"
#include "common/node_table.h"
#include "head/placement_groups.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

// What the actor directory needs from the head's node table. Every method is called with the
// head's mutex held.
class ActorNodes {
 public:
  virtual ~ActorNodes() = default;
  // Every node the head knows (alive or not) by id, and the pool their names are interned in.
  virtual const std::map<std::string, NodeEntry>& Nodes() = 0;
  virtual const NamePool& Names() = 0;
  // The alive nodes, indexed for placement decisions.
  virtual const PlacementIndex& Placement() = 0;
  // Takes `res` off node `node_id`'s available resources in the head's table until its next
  // heartbeat says otherwise (so that a burst of creations spreads out).
  virtual void Charge(const std::string& node_id, const ResourceMap& res) = 0;
  // The node's address ("" when unknown).
  virtual std::string NodeAddress(const std::string& node_id) = 0;
};

class ActorDirectory {
 public:
  // All references outlive this; `stopping` is the head's (set when it begins to stop).
  ActorDirectory(Mutex& mu, ActorNodes& nodes, PlacementGroupManager& pgs, WorkQueue& work,
                 const std::string& token, const std::atomic<bool>& stopping)
      : mu_(mu), nodes_(nodes), pgs_(pgs), work_(work), token_(token), stopping_(stopping) {}
  ActorDirectory(const ActorDirectory&) = delete;
  ActorDirectory& operator=(const ActorDirectory&) = delete;

  // The rpc::Head actor calls (the token already checked); errors go into the reply.
  void Create(const rpc::CreateActorRequest& req, rpc::CreateActorReply* reply) EXCLUDES(mu_);
  void WorkerDied(const rpc::ActorWorkerDiedRequest& req) EXCLUDES(mu_);
  void Get(grpc::ServerContext* ctx, const rpc::GetActorRequest& req, rpc::GetActorReply* reply)
      EXCLUDES(mu_);
  void Kill(const rpc::KillActorRequest& req) EXCLUDES(mu_);
  // The record of the actor named `name` in namespace `ns`, unless there is none or it is DEAD
  // (for the head's own callers, e.g. the Serve REST API looking for Serve's controller).
  std::optional<rpc::ActorRecord> FindNamed(const std::string& ns, const std::string& name) const EXCLUDES(mu_);
  // Wakes the waiters in Get and cancels the StartActor calls in flight (the head is stopping).
  void Stop() EXCLUDES(mu_);

  // For the head, which holds the same mutex under its own name: tells clang's analysis that
  // it is held (no run-time effect).
  void AssertHeld() const ASSERT_CAPABILITY(mu_) {}
  // Places the actors that wait (PENDING, RESTARTING) whose node can be chosen now.
  void ScheduleLocked() REQUIRES(mu_);
  // Node `node_id` stopped or died (`cause`): its ALIVE actors (and with `pending_too` those
  // being placed there) restart elsewhere or die.
  void OnNodeGoneLocked(const std::string& node_id, const std::string& cause, bool pending_too)
      REQUIRES(mu_);
  // The job finished: its non-detached actors die (their workers are killed).
  void FinishJobLocked(const std::string& job_id) REQUIRES(mu_);
  // A placement group was granted: the actors waiting for it may be placed; waiters wake.
  void OnPgCreatedLocked() REQUIRES(mu_);
  // Group `pg_id` was removed (`why`): its actors die.
  void OnPgRemovedLocked(const std::string& pg_id, const std::string& why) REQUIRES(mu_);
  // A slice of group `pg_id` was lost: the workers of its alive actors are killed.
  void OnPgSliceLostLocked(const std::string& pg_id) REQUIRES(mu_);
  void AppendTo(rpc::ListReply* reply) const REQUIRES(mu_);
  // Durable state (head/head_store.h): every change to an actor is written to `store` (null:
  // memory only) before the call that made it returns. Set once, before serving.
  void AttachStore(HeadStore* store) { store_ = store; }
  // A resumed head: the actors of `records` (kActor values) as they were, but those being
  // placed go back to waiting; named ones are reachable by name again. Returns how many, or an
  // error for a garbled record (then nothing is taken).
  StatusOr<size_t> RestoreLocked(const std::vector<std::pair<std::string, std::string>>& records) REQUIRES(mu_);
  // A resumed head's grace ended: restored placements no longer wait for their node.
  void EndResumeGraceLocked() REQUIRES(mu_);
  // The node ids of the actors that are ALIVE or being placed.
  std::set<std::string> NodesInUseLocked() const REQUIRES(mu_);

 private:
  struct ActorEntry {
    rpc::ActorRecord rec;
    rpc::CreateActorRequest spec;
    bool placing = false;      // a placement attempt is running
    bool no_restart = false;   // killed with no_restart
    std::string pending_reason;
    LabelSelectorTerms selector;
    // Restored with a placement in flight: the node that may be starting it (tried first).
    std::string resume_node;
  };

  // Create's check of a placement-group actor's group and bundle; false with the reply's error set.
  bool CheckGroupLocked(const rpc::CreateActorRequest& req, rpc::CreateActorReply* reply) REQUIRES(mu_);
  // ScheduleLocked's two ways: inside the actor's placement group (the bundle's node), or the
  // least-loaded feasible node.
  void PlaceInGroupLocked(const std::string& id, ActorEntry& a) REQUIRES(mu_);
  void PlaceOnNodeLocked(const std::string& id, ActorEntry& a) REQUIRES(mu_);
  // The node for an actor: the first candidate (the least loaded that fits), or for SPREAD the
  // next node in id order after the last SPREAD choice among those that fit (round robin).
  // Null: none fits now.
  const std::string* ChooseNodeLocked(const PlacementIndex& index, const PlacementIndex::Demand& demand,
                                      bool spread) REQUIRES(mu_);
  // Posts the placement attempt of actor `id` on node `node_id` to the work queue.
  void PostPlacementLocked(const std::string& id, ActorEntry& a, const std::string& node_id,
                           const std::string& node_address) REQUIRES(mu_);
  // A placement attempt (work queue thread): StartActor without mu, then its outcome.
  void Place(const std::string& actor_id, const std::string& node_id, const std::string& node_address)
      EXCLUDES(mu_);
  void OnWorkerGoneLocked(ActorEntry& a, const std::string& cause, bool intentional) REQUIRES(mu_);
  // Fire-and-forget Node.KillWorker for the actor's worker (on the work queue).
  void KillWorkerLocked(const rpc::ActorRecord& rec) REQUIRES(mu_);

  // Writes `a` to the store (no-op without one); a failed write is logged.
  void SaveLocked(const ActorEntry& a) REQUIRES(mu_);
  // A restored actor whose placement was in flight goes to that node again once it is back;
  // true when it was posted there, or must wait for it (the resume grace is on).
  bool ResumePlacementLocked(const std::string& id, ActorEntry& a) REQUIRES(mu_);
  std::string spread_last_ GUARDED_BY(mu_);  // the node of the last SPREAD actor placed
  bool resume_grace_ GUARDED_BY(mu_) = false;  // set by RestoreLocked, ended by the head
  HeadStore* store_ = nullptr;  // set before serving
  // Dead actors are kept for queries (`torus list actors`, a caller learning why) up to
  // kKeepDeadActors, oldest death first out (memory and store). Trimmed in Create only: never
  // while a caller iterates over actors_.
  static constexpr size_t kKeepDeadActors = 10000;
  std::deque<std::string> dead_order_ GUARDED_BY(mu_);
  void TrimDeadLocked() REQUIRES(mu_);

  // constant after construction
  Mutex& mu_;
  ActorNodes& nodes_;
  PlacementGroupManager& pgs_;
  WorkQueue& work_;
  const std::string& token_;
  const std::atomic<bool>& stopping_;

  CondVar cv_;  // actor state changes, and Stop
  std::unordered_map<std::string, ActorEntry> actors_ GUARDED_BY(mu_);
  std::map<std::pair<std::string, std::string>, std::string> named_ GUARDED_BY(mu_);  // (ns, name) -> id
  // The StartActor calls in flight (Place), cancelled by Stop.
  std::set<grpc::ClientContext*> placing_calls_ GUARDED_BY(mu_);
};

}  // namespace torus
