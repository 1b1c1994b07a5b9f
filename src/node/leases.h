// LeaseScheduler: the node's task leases. Queues lease requests, sets resources aside for them
// from the node's ledger or from a placement-group bundle, grants each an idle worker of its
// key (starting workers when none is idle), spills requests that cannot run here to a node of
// the cluster view (the head's, refreshed by heartbeats), ends leases (returned, the worker
// dead, taken back by the lease audit) and lends a blocked worker's CPU out (NotifyBlocked).
//
// LEASES
//  A lease ends when its holder returns it (ReturnLease), when the worker's task stream from the
//  holder ends (the worker returns it: the holder finished, or died), when the worker dies, or
//  when the audit finds it never used (the grant's reply was lost: the requester gave up, timed
//  out or exited at that moment). Every way a request or a lease ends gives its resources back
//  through GiveBackLocked -> Ledger::Return. A request that cannot run here spills to a node
//  whose last reported view has room; a request already spilled here waits, but spills again
//  once it has waited kRespillAfter (1 s) and another node has room for it now. A SPREAD
//  request (not yet spilled) spills to the view's roomiest node when that node has more room
//  for it than this one (node/peer_view.h PickRoomier); on a tie it stays here.
//
// THREADS: shares the node's mutex (NodeState::mu; node/node_state.h). Request blocks its gRPC
// handler thread on NodeState::cv until the request is answered (checking every 200 ms whether
// the requester went away). The methods marked EXCLUDES take the lock themselves; those marked
// REQUIRES are for the node's other parts, which hold it. Everything below `st_` is guarded by
// NodeState::mu.
#pragma once

#include <chrono>
#include <list>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/labels.h"
#include "common/resources.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "node/lease_audit.h"
#include "node/node_state.h"
#include "node/peer_view.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

class LeaseScheduler {
 public:
  // `st`, `node_id` and `labels` (the node's own, complete once the node starts) outlive this.
  LeaseScheduler(NodeState& st, const std::string& node_id, const std::map<std::string, std::string>& labels)
      : st_(st), node_id_(node_id), labels_(labels), peers_(node_id) {}
  LeaseScheduler(const LeaseScheduler&) = delete;
  LeaseScheduler& operator=(const LeaseScheduler&) = delete;

  // RequestLease: answers with a grant, a spillback address or an error once it has one;
  // CANCELLED when the requester went away meanwhile (a grant made just then is taken back),
  // UNAVAILABLE when the node is stopping.
  grpc::Status Request(grpc::ServerContext* ctx, const rpc::LeaseRequest& req, rpc::LeaseReply* reply)
      EXCLUDES(st_.mu);
  // ReturnLease: the lease's resources go back; the worker idles (or, worker_dead, is killed).
  void Return(const std::string& lease_id, bool worker_dead) EXCLUDES(st_.mu);
  // NotifyBlocked: a leased or actor worker blocked in Get lends its CPU out until it resumes.
  void Blocked(const std::string& worker_id, bool blocked) EXCLUDES(st_.mu);

  // The lease audit's hooks (node/lease_audit.h): the leases to ask about (also lets queued
  // requests that have waited spill again), and what a worker said about one (REVOKED: the
  // lease is taken back; `check_age` only for the log).
  std::vector<LeaseAudit::Question> AuditDue(std::chrono::milliseconds check_age) EXCLUDES(st_.mu);
  void AuditAnswered(const LeaseAudit::Question& q, rpc::CheckLeaseReply::Use use,
                     std::chrono::milliseconds check_age) EXCLUDES(st_.mu);

  // Takes a cluster view from a heartbeat reply (whole or delta) and schedules again.
  void ApplyView(const rpc::HeartbeatReply& reply) EXCLUDES(st_.mu);

  // For the node's other parts, with NodeState::mu held.
  void AssertHeld() const ASSERT_CAPABILITY(st_.mu) {}
  // Looks at every queued request again (resources, workers or the view changed).
  void ScheduleLocked() REQUIRES(st_.mu);
  // The heartbeat's part: pending demands by shape, the view version, whether a view is wanted.
  void FillHeartbeatLocked(rpc::HeartbeatRequest* req) REQUIRES(st_.mu);
  // A worker holding `lease_id` exited (its resources go back with it).
  void ForgetLeaseLocked(const std::string& lease_id) REQUIRES(st_.mu) { worker_by_lease_.erase(lease_id); }
  // Queued requests for placement group `pg_id` (removed from this node) fail now.
  void FailGroupLocked(const std::string& pg_id) REQUIRES(st_.mu);
  // Every queued request fails with `why` (the node is stopping).
  void FailAllLocked(const Status& why) REQUIRES(st_.mu);

 private:
  struct PendingLease {
    rpc::LeaseRequest req;
    ResourceMap res;
    LabelSelectorTerms selector;
    Hold hold;  // what was set aside for it (hold.held: resources taken)
    bool done = false;
    bool infeasible = false;
    std::chrono::steady_clock::time_point queued_at = std::chrono::steady_clock::now();
    rpc::LeaseReply reply;
  };
  // Starts the workers the waiting leases need (key -> count); a start that fails answers
  // every lease of that key with the error. True when some lease got its answer.
  struct WorkerNeed {
    int count = 0;
    const PendingLease* example = nullptr;
  };

  // Where p's resources come from: false when it must wait, or (with *answered) when it has
  // its answer (an error, or another node to go to).
  bool HoldResourcesLocked(PendingLease& p, bool* answered) REQUIRES(st_.mu);
  // The worker pool key of a lease: its runtime key, chips and bundle environment.
  std::string LeaseWorkerKey(const PendingLease& p) const REQUIRES(st_.mu);
  // Grants p's lease on idle worker w.
  void GrantLocked(PendingLease& p, Worker& w) REQUIRES(st_.mu);
  bool StartNeededWorkersLocked(const std::map<std::string, WorkerNeed>& need) REQUIRES(st_.mu);
  bool TrySpillback(PendingLease& p) REQUIRES(st_.mu);
  // Answers `p` with a spillback to `target`, charging the view for it.
  void SpillTo(PendingLease& p, const PeerView::Target& target) REQUIRES(st_.mu);
  bool AnyNodeCouldFit(const ResourceMap& res, const LabelSelectorTerms& selector) const REQUIRES(st_.mu);
  // Takes a placement-group lease's resources from its bundle. False: must wait (or, with
  // *error set, can never be served here).
  bool TakeFromBundle(PendingLease& p, std::string* error) REQUIRES(st_.mu);
  // The one way a lease request gives back what it was given: its set-aside resources and
  // chips, or once granted its lease (the worker idles again). Marks it done, with `why` as its
  // reply's error unless ok.
  void GiveBackLocked(PendingLease& p, const Status& why) REQUIRES(st_.mu);
  // Ends lease `lease_id` if a worker still holds it: its resources go back, the worker idles
  // (or, with worker_dead, is killed). False when no worker holds it.
  bool EndLeaseLocked(const std::string& lease_id, bool worker_dead) REQUIRES(st_.mu);
  // Undoes the grant of `p` after its requester went away: the worker idles again.
  void UngrantLocked(PendingLease& p) REQUIRES(st_.mu);
  std::vector<rpc::PendingDemand> PendingDemandsLocked() const REQUIRES(st_.mu);

  NodeState& st_;
  const std::string& node_id_;
  const std::map<std::string, std::string>& labels_;

  std::unordered_map<std::string, std::string> worker_by_lease_ GUARDED_BY(st_.mu);
  std::list<std::shared_ptr<PendingLease>> pending_ GUARDED_BY(st_.mu);
  PeerView peers_ GUARDED_BY(st_.mu);  // the other nodes, from the head's views
  uint64_t view_version_ GUARDED_BY(st_.mu) = 0;
};

}  // namespace torus
