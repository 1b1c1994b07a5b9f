// The node daemon (`torus node`): one per host. The gRPC and lane service of the node, a thin
// adapter over its parts, which it owns and wires together:
//  - NodeState (node/node_state.h): the resource Ledger and the WorkerPool under one mutex;
//  - LeaseScheduler (node/leases.h): task lease requests, grants, spillback, lease ends;
//  - ActorStarter (node/actor_start.h): StartActor;
//  - BundleHandler (node/bundles.h): placement-group bundles (Prepare/Commit/ReleaseBundles);
//  - ObjectStore (node/object_store.h): the shared-memory object store;
//  - JobRunner (node/job_runner.h): processes of submitted jobs;
//  - Heartbeat (node/heartbeat.h) and LeaseAudit (node/lease_audit.h), with their threads.
// The Node itself registers with the head, reaps its workers, answers the worker RPCs
// (RegisterWorker, KillWorker, GetWorkerExit), Info and Shutdown, and stops everything.
//
// THREADS (every thread is owned and joined: Stop() joins the reaper, the heartbeat and the
// lease audit; the destructor joins the Shutdown RPC's Stop() thread and a heartbeat that gave up)
//  - gRPC sync-server threads run the handlers. RequestLease and StartActor may block (on
//    NodeState::cv) until a worker is available; the ledger, the worker pool, pending leases and
//    the cluster view are guarded by NodeState::mu; the object store has its own lock.
//  - lane threads (common/lane.h) run the bundle calls from the head, under NodeState::mu.
//  - heartbeat thread (Heartbeat, node/heartbeat.h): reports available resources and pending
//    demands to the head every heartbeat_ms, receives the cluster view (used for spillback),
//    stops long-idle workers; its hooks FillHeartbeat/ApplyHeartbeat take NodeState::mu.
//  - watch thread (PeerWatch, node/peer_watch.h): holds this node's watch link to the next node
//    of the watch ring and reports its end to the head (no lock of ours). The other end, the
//    watch stream of the node that watches this one, holds one lane thread.
//  - reaper thread: waitpid() on worker processes (asleep on their pidfds); a death releases the
//    worker's resources and, for an actor, is reported to the head (by the reaper, without the lock).
//  - lease audit thread (LeaseAudit, node/lease_audit.h): twice a second, asks each worker whose
//    lease was granted more than TORUS_LEASE_CHECK_MS (default 3000) ago and is not yet known to
//    be in use whether its holder came (CoreWorker.CheckLease, without the lock), and takes back
//    leases whose grant never reached their holder (LeaseScheduler::AuditDue/AuditAnswered).
#pragma once

#include <sys/types.h>

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "common/head_addresses.h"
#include "common/http_server.h"
#include "common/rpc.h"
#include "common/lane.h"
#include "common/metrics.h"
#include "common/one_shot_thread.h"
#include "common/resources.h"
#include "common/shm_owner.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "node/actor_start.h"
#include "node/bundles.h"
#include "node/peer_watch.h"
#include "node/heartbeat.h"
#include "node/job_runner.h"
#include "node/lease_audit.h"
#include "node/leases.h"
#include "node/log_files.h"
#include "node/node_state.h"
#include "node/object_store.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

struct NodeConfig {
  std::string node_id;          // "" = random
  std::string head_address;     // host:port of the head
  std::string bind_host = "127.0.0.1";
  int port = 0;                 // 0 = pick
  std::string session_dir;
  std::string token;
  ResourceDoubles resources;    // totals as given (validated and rounded at Start); CPU defaults to the cores
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
  std::string spill_dir;            // objects spilled from a full store; "" = <session_dir>/spill/<id>
  std::string logs_dir;             // workers' log files; "" = <session_dir>/logs
  // The node's HTTP surface (docs/http.md: the health probe KubeRay runs on every pod) on
  // agent_host:agent_port. -1: none; 0: any free port; with agent_port_fallback a port in use is
  // replaced by a free one (logged), otherwise Start fails.
  std::string agent_host = "127.0.0.1";
  int agent_port = -1;
  bool agent_port_fallback = false;
  // List the session files of the logs directory no node owns (the head's, the launcher's) in
  // `torus logs`: set on the node started with the head.
  bool serve_session_logs = false;
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
  // The HTTP surface's "host:port" ("" without one). Set by Start.
  std::string agent_address() const { return http_ ? http_->address() : ""; }

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
  grpc::Status RestoreObject(grpc::ServerContext*, const rpc::RestoreObjectRequest*,
                             rpc::CreateObjectReply*) override;
  grpc::Status FetchObject(grpc::ServerContext*, const rpc::FetchObjectRequest*,
                           grpc::ServerWriter<rpc::ObjectChunk>*) override;
  grpc::Status ListLogs(grpc::ServerContext*, const rpc::Empty*, rpc::LogFileList*) override;
  grpc::Status ReadLog(grpc::ServerContext*, const rpc::ReadLogRequest*, rpc::ReadLogReply*) override;
  grpc::Status Info(grpc::ServerContext*, const rpc::Empty*, rpc::NodeInfoReply*) override;
  grpc::Status HeadAddresses(grpc::ServerContext*, const rpc::Empty*, rpc::HeadAddressesReply*) override;
  grpc::Status SetWatch(grpc::ServerContext*, const rpc::WatchTarget*, rpc::Empty*) override;
  grpc::Status Ping(grpc::ServerContext*, const rpc::PingRequest*, rpc::Empty*) override;
  grpc::Status Shutdown(grpc::ServerContext*, const rpc::Empty*, rpc::Empty*) override;
  grpc::Status PrepareBundles(grpc::ServerContext*, const rpc::BundlesRequest*,
                              rpc::PrepareBundlesReply*) override;
  grpc::Status CommitBundles(grpc::ServerContext*, const rpc::BundlesRequest*,
                             rpc::PrepareBundlesReply*) override;
  grpc::Status ReleaseBundles(grpc::ServerContext*, const rpc::BundlesRequest*,
                              rpc::PrepareBundlesReply*) override;

 private:
  // Reads the host's TPU identity (docs/tpu.md section 4) into labels and resources. No lock.
  Status DetectTpu(ResourceMap* total);
  // Cleans dead siblings' segments, takes this node's shm owner lock, and sizes the arena and
  // the "memory" resource against the other nodes of this host (node/arena.h, shm_owner.h).
  Status SizeArenaAndMemory(ResourceMap* total);
  // Start's last steps: the lane and gRPC servers, and the registration with the head.
  Status Serve() EXCLUDES(st_.mu);
  void HandleWorkerExit(pid_t pid, int status) EXCLUDES(st_.mu);
  // Waits (up to 1.5 s) until none of `pids` is left in the pool.
  void WaitForExitsLocked(MutexLock& lock, const std::vector<pid_t>& pids) REQUIRES(st_.mu);
  // Logs why and stops the node, from the heartbeat thread.
  void GiveUp(const grpc::Status& last);
  // The watch ring (node.cc): the Node/Watch lane stream a watcher holds, and the report of
  // this node's own watch link ending (from the watch thread).
  grpc::Status ServeWatch(LaneServerStream* s);
  bool ReportPeerLost(const std::string& node_id, const std::string& how);  // true: the head was told
  // The heartbeat's hooks (no lock held; they take the lock). FillHeartbeat also SIGTERMs idle
  // workers beyond the CPU count; false once the node is stopping.
  bool FillHeartbeat(rpc::HeartbeatRequest* req) EXCLUDES(st_.mu);
  void ApplyHeartbeat(const rpc::HeartbeatRequest& req, const rpc::HeartbeatReply& reply) EXCLUDES(st_.mu);
  // The jobs ended (a heartbeat reply said so): their idle workers are stopped now, and their
  // busy ones once idle.
  void StopFinishedJobsWorkers(const google::protobuf::RepeatedPtrField<std::string>& jobs) EXCLUDES(st_.mu);
  std::vector<pid_t> IdleToStopLocked() REQUIRES(st_.mu);
  void ReaperLoop() EXCLUDES(st_.mu);
  Status RegisterWithHead() EXCLUDES(st_.mu);
  Status StartHttp();  // the agent's HTTP surface, when cfg_.agent_port >= 0
  MetricFamilies CollectMetrics();  // the state gauges of /metrics (node_metrics.cc)

  // constant after construction / Start()
  NodeConfig cfg_;
  std::string address_;
  std::string shm_prefix_;
  ShmOwnerLock shm_lock_;  // held while this node's segments live
  std::string hostname_;
  std::vector<int> tpu_chip_ids_;  // physical ids of this host's chips
  std::unique_ptr<LaneServer> lane_;  // bundle calls from the head (docs/wire.md)
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<HttpServer> http_;  // the agent's HTTP surface (cfg_.agent_port >= 0)
  std::atomic<bool> serving_{false};  // Start finished: registered, threads running
  std::atomic<bool> registered_{false};  // Start registered with the head (Stop unregisters)
  LogFiles log_files_;  // before job_runner_ and the pool's users: they claim into it
  std::unique_ptr<JobRunner> job_runner_;  // processes of submitted jobs (docs/jobs.md)

  // The parts (each header states its contract and threads).
  NodeState st_;
  // The head's address (and its standbys', learnt from its replies): the heartbeat moves to the
  // next one when the current cannot be reached (common/head_addresses.h).
  std::shared_ptr<torus::HeadAddresses> heads_;
  std::unique_ptr<rpc::Head::Stub> HeadStub() const { return rpc::Head::NewStub(GetChannel(heads_->current())); }
  ObjectStore objects_{cfg_.node_id};
  LeaseScheduler leases_{st_, cfg_.node_id, cfg_.labels};
  ActorStarter actors_{st_, cfg_.token};
  BundleHandler bundles_{st_, leases_, cfg_.labels, cfg_.node_id};

  std::atomic<bool> gave_up_{false};
  // The node's place in the head's log of finished jobs (head/finished_jobs.h); only the
  // heartbeat thread touches these.
  std::string jobs_epoch_;
  uint64_t jobs_seq_ = 0;
  Mutex stop_mu_;
  bool stopped_ GUARDED_BY(stop_mu_) = false;
  CondVar stopped_cv_;
  std::thread reaper_thread_;
  OneShotThread shutdown_;  // runs Stop() for the Shutdown RPC; joined by the destructor
  // Declared last: destroyed (stopped and joined) first, before the state their hooks use.
  std::unique_ptr<LeaseAudit> lease_audit_;
  std::unique_ptr<Heartbeat> heartbeat_;
  // This node's watch link (node/peer_watch.h); its lost hook calls the head.
  std::unique_ptr<PeerWatch> peer_watch_;
};

}  // namespace torus
