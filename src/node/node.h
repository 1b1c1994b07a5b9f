// The node daemon (`torus node`): one per host. Owns the host's resource ledger, its worker
// processes, lease grants (with spillback to other nodes), the shared-memory object directory
// of this host, and heartbeats to the head.
//
// THREADS (every thread is owned and joined: Stop() joins the reaper, the heartbeat and the
// lease audit; the destructor joins the Shutdown RPC's Stop() thread and a heartbeat that gave up)
//  - gRPC sync-server threads run the handlers. RequestLease and StartActor may block (on cv_)
//    until a worker is available; everything they touch is guarded by mu_: the Ledger
//    (node/ledger.h), the WorkerPool (node/worker_pool.h), pending leases, objects, the view.
//  - heartbeat thread (Heartbeat, node/heartbeat.h): reports available resources and pending
//    demands to the head every heartbeat_ms, receives the cluster view (used for spillback),
//    stops long-idle workers; its hooks FillHeartbeat/ApplyHeartbeat take mu_.
//  - reaper thread: waitpid() on worker processes (asleep on their pidfds); a death releases the
//    worker's resources and, for an actor, is reported to the head (by the reaper, never under mu_).
//  - lease audit thread (LeaseAudit, node/lease_audit.h): twice a second, asks each worker whose
//    lease was granted more than TORUS_LEASE_CHECK_MS (default 3000) ago and is not yet known to
//    be in use whether its holder came (CoreWorker.CheckLease, outside mu_), and takes back leases
//    whose grant never reached their holder; also lets queued requests that waited spill again.
//
// LEASES
//  A lease ends when its holder returns it (ReturnLease), when the worker's task stream from the
//  holder ends (the worker returns it: the holder finished, or died), when the worker dies, or
//  when the audit finds it never used (the grant's reply was lost: the requester gave up, timed
//  out or exited at that moment). A request that cannot run here spills to a node whose last
//  reported view has room; a request already spilled here waits, but spills again once it has
//  waited kRespillAfter and another node has room for it now.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <list>
#include <set>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/labels.h"
#include "common/lane.h"
#include "common/one_shot_thread.h"
#include "common/process.h"
#include "common/resources.h"
#include "common/shm.h"
#include "common/shm_owner.h"
#include "node/arena.h"
#include "node/job_runner.h"
#include "node/heartbeat.h"
#include "node/lease_audit.h"
#include "node/ledger.h"
#include "node/worker_pool.h"
#include "common/status.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

struct NodeConfig {
  std::string node_id;          // "" = random
  std::string head_address;     // host:port of the head
  std::string bind_host = "127.0.0.1";
  int port = 0;                 // 0 = pick
  std::string session_dir;
  std::string token;
  ResourceMap resources;        // totals; CPU defaults to the number of cores
  std::map<std::string, std::string> labels;  // user labels: no reserved key (ValidateUserLabels)
  std::string node_group;       // the launcher's group: label torus.io/node-group ("" = none)
  std::string torus_exe;        // the torus binary, for `torus worker` (code search path mode)
  int heartbeat_ms = 100;
  // The node gives up (stops its workers and jobs, frees its shared memory, exits) after this
  // long without a successful heartbeat: the head refuses its token (a restarted head has a new
  // session and token; this node can never join it) or cannot be reached.
  int head_lost_ms = 30000;
  int idle_worker_keep_ms = 10000;  // idle workers above the CPU count are stopped after this
  uint64_t object_store_bytes = 0;  // arena capacity; 0 = DefaultArenaBytes (node/arena.h)
  std::string logs_dir;             // workers' log files; "" = <session_dir>/logs
};

class Node final : public rpc::Node::Service {
 public:
  explicit Node(NodeConfig cfg);
  ~Node() override;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  // Binds the port, registers with the head and starts the threads.
  Status Start();
  // Blocks until Stop() has finished.
  void Wait();
  // Stops workers, frees this node's shared memory, unregisters. Idempotent, any thread.
  void Stop();
  // True once the node stopped itself because the head was lost (NodeConfig::head_lost_ms).
  bool gave_up() const { return gave_up_; }

  const std::string& id() const { return cfg_.node_id; }
  std::string address() const { return address_; }

  // rpc::Node::Service
  grpc::Status RegisterWorker(grpc::ServerContext*, const rpc::RegisterWorkerRequest*,
                              rpc::RegisterWorkerReply*) override;
  grpc::Status RequestLease(grpc::ServerContext*, const rpc::LeaseRequest*,
                            rpc::LeaseReply*) override;
  grpc::Status ReturnLease(grpc::ServerContext*, const rpc::ReturnLeaseRequest*,
                           rpc::Empty*) override;
  grpc::Status NotifyBlocked(grpc::ServerContext*, const rpc::BlockedRequest*,
                             rpc::Empty*) override;
  grpc::Status StartActor(grpc::ServerContext*, const rpc::StartActorRequest*,
                          rpc::StartActorReply*) override;
  grpc::Status KillWorker(grpc::ServerContext*, const rpc::KillWorkerRequest*,
                          rpc::Empty*) override;
  grpc::Status GetWorkerExit(grpc::ServerContext*, const rpc::WorkerExitRequest*,
                             rpc::WorkerExitReply*) override;
  grpc::Status CreateObject(grpc::ServerContext*, const rpc::CreateObjectRequest*,
                            rpc::CreateObjectReply*) override;
  grpc::Status FreeObjects(grpc::ServerContext*, const rpc::FreeObjectsRequest*,
                           rpc::Empty*) override;
  grpc::Status FetchObject(grpc::ServerContext*, const rpc::FetchObjectRequest*,
                           grpc::ServerWriter<rpc::ObjectChunk>*) override;
  grpc::Status Info(grpc::ServerContext*, const rpc::Empty*, rpc::NodeInfoReply*) override;
  grpc::Status Shutdown(grpc::ServerContext*, const rpc::Empty*, rpc::Empty*) override;
  grpc::Status PrepareBundles(grpc::ServerContext*, const rpc::BundlesRequest*,
                              rpc::PrepareBundlesReply*) override;
  grpc::Status CommitBundles(grpc::ServerContext*, const rpc::BundlesRequest*,
                             rpc::PrepareBundlesReply*) override;
  grpc::Status ReleaseBundles(grpc::ServerContext*, const rpc::BundlesRequest*,
                              rpc::PrepareBundlesReply*) override;
  // Reserves (and with `commit`, commits) the request's bundles, all or none (require mu_);
  // false with *error when they do not fit or a label selector does not match.
  bool PrepareLocked(const rpc::BundlesRequest& req, std::string* error);
  // Releases the request's bundles (all of the group's when it names none) and ends the work
  // in them: the pids to SIGKILL once mu_ is released are added to *to_kill (require mu_).
  void ReleaseLocked(const rpc::BundlesRequest& req, std::vector<pid_t>* to_kill);
  // The lane's PrepareBundles (prepare) or ReleaseBundles: serialised request in, reply out.
  grpc::Status LaneBundles(bool prepare, std::string_view in, std::string* out);

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
  struct StoredObject {
    std::string object_id;
    uint64_t size = 0;
    uint64_t offset = 0;
    std::string owner;
  };

  // Reads the host's TPU identity (docs/tpu.md section 4) into labels and resources. No lock.
  Status DetectTpu(ResourceMap* total);
  // Cleans dead siblings' segments, takes this node's shm owner lock, and sizes the arena and
  // the "memory" resource against the other nodes of this host (node/arena.h, shm_owner.h).
  Status SizeArenaAndMemory(ResourceMap* total);
  // All private helpers below require mu_ held unless said otherwise.
  void TrySchedule();
  // TrySchedule's steps. Where p's resources come from: false when it must wait, or (with
  // *answered) when it has its answer (an error, or another node to go to).
  bool HoldResourcesLocked(PendingLease& p, bool* answered);
  // The worker pool key of a lease: its runtime key, chips and bundle environment.
  std::string LeaseWorkerKey(const PendingLease& p) const;
  // Grants p's lease on idle worker w.
  void GrantLocked(PendingLease& p, Worker& w);
  // Starts the workers the waiting leases need (`need`: key -> count); a start that fails
  // answers every lease of that key with the error. True when some lease got its answer.
  struct WorkerNeed {
    int count = 0;
    const PendingLease* example = nullptr;
  };
  bool StartNeededWorkersLocked(const std::map<std::string, WorkerNeed>& need);
  // StartActor's steps: the worker of a new actor (an idle one of its key, else a fresh one,
  // waited for up to 60 s), or null with reply's error set (its hold then given back).
  Worker* ActorWorkerLocked(std::unique_lock<std::mutex>& lock, const rpc::StartActorRequest& req,
                            const std::string& key, Hold& hold, rpc::StartActorReply* reply);
  // Runs the actor's constructor on its worker (no lock), filling reply.
  void RunConstructor(const rpc::StartActorRequest& req, const std::string& worker_id,
                      const std::string& worker_address, rpc::StartActorReply* reply);
  bool TrySpillback(PendingLease& p);
  bool AnyNodeCouldFit(const ResourceMap& res, const LabelSelectorTerms& selector) const;
  // Takes a placement-group lease's resources from its bundle. False: must wait (or, with
  // *error set, can never be served here).
  bool TakeFromBundle(PendingLease& p, std::string* error);
  // The one way a lease request gives back what it was given: its set-aside resources and
  // chips, or once granted its lease (the worker idles again). Marks it done, with `why` as its
  // reply's error unless ok. Require mu_.
  void GiveBackLocked(PendingLease& p, const Status& why);
  // Ends lease `lease_id` if a worker still holds it: its resources go back, the worker idles
  // (or, with worker_dead, is killed). False when no worker holds it. Require mu_.
  bool EndLeaseLocked(const std::string& lease_id, bool worker_dead);
  // Undoes the grant of `p` after its requester went away: the worker idles again. Require mu_.
  void UngrantLocked(PendingLease& p);
  // The lease audit's hooks (no lock held; they take mu_): the leases to ask about, and what
  // a worker said about one (REVOKED: the lease is taken back).
  std::vector<LeaseAudit::Question> AuditDue(std::chrono::milliseconds check_age);
  void AuditAnswered(const LeaseAudit::Question& q, rpc::CheckLeaseReply::Use use);
  void HandleWorkerExit(pid_t pid, int status);
  // Logs why and stops the node, from the heartbeat thread.
  void GiveUp(const grpc::Status& last);
  // The heartbeat's hooks (no lock held; they take mu_). FillHeartbeat also SIGTERMs idle
  // workers beyond the CPU count; false once the node is stopping.
  bool FillHeartbeat(rpc::HeartbeatRequest* req);
  void ApplyHeartbeat(const rpc::HeartbeatRequest& req, const rpc::HeartbeatReply& reply);
  void ApplyViewDeltaLocked(const rpc::HeartbeatReply& reply);  // require mu_
  void ReaperLoop();
  Status RegisterWithHead();  // no lock
  std::vector<rpc::PendingDemand> PendingDemands();

  // constant after construction / Start()
  NodeConfig cfg_;
  std::string address_;
  std::string shm_prefix_;
  ShmOwnerLock shm_lock_;  // held while this node's segments live
  std::string hostname_;
  std::string arena_name_;
  std::vector<int> tpu_chip_ids_;  // physical ids of this host's chips
  std::unique_ptr<Mapping> arena_;  // the object store; every process of the node maps it
  std::unique_ptr<LaneServer> lane_;  // bundle calls from the head (docs/wire.md)
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<rpc::Head::Stub> head_;
  std::unique_ptr<JobRunner> job_runner_;  // processes of submitted jobs (docs/jobs.md)

  std::mutex mu_;
  std::condition_variable cv_;
  // guarded by mu_
  Ledger ledger_;
  ChildExitWaiter reaper_waiter_;  // ReaperLoop sleeps here until a worker exits or starts
  WorkerPool pool_{&reaper_waiter_};
  std::unordered_map<std::string, std::string> worker_by_lease_;
  std::list<std::shared_ptr<PendingLease>> pending_;
  std::map<std::string, StoredObject> objects_;  // by key
  std::unique_ptr<ArenaAllocator> arena_alloc_;
  std::vector<rpc::NodeRecord> view_;            // other nodes, from the head
  uint64_t view_version_ = 0;

  std::atomic<bool> stopping_{false};
  std::atomic<bool> gave_up_{false};
  std::mutex stop_mu_;
  bool stopped_ = false;
  std::condition_variable stopped_cv_;
  std::thread reaper_thread_;
  OneShotThread shutdown_;  // runs Stop() for the Shutdown RPC; joined by the destructor
  // Declared last: destroyed (stopped and joined) first, before the state their hooks use.
  std::unique_ptr<LeaseAudit> lease_audit_;
  std::unique_ptr<Heartbeat> heartbeat_;
};

}  // namespace torus
