// The head daemon (`torus head`): the cluster's control plane, and the gRPC/lane service that
// translates the rpc::Head calls into calls on its parts:
//  - the node table and membership (this class, with common/node_table.h and cluster_view.cc):
//    registration, liveness by heartbeat, heartbeat pacing, the cluster views shipped to nodes,
//    the slice index;
//  - ActorDirectory (head/actors.h): actor placement, names per namespace, restarts, deaths;
//  - PlacementGroupManager (head/placement_groups.h): placement groups and slice reservations;
//  - the job table of drivers (this class) and JobManager (head/jobs.h) for submitted jobs;
//  - KvStore (head/kv_store.h);
//  - on the HTTP port: the Jobs REST API (head/jobs_http.h), Serve's REST API
//    (head/serve_http.h), the dashboard (head/dashboard_http.h), /metrics (head_metrics.cc,
//    then Serve's metrics: head/serve_metrics.h).
// Not on the task hot path: tasks are placed by the nodes.
//
// THREADS
//  - gRPC sync-server threads run the handlers; the node table, the job table, the actors and
//    the placement groups are guarded by mu_, which the ActorDirectory and the
//    PlacementGroupManager (with its scheduler thread) share. The KvStore has its own lock.
//  - monitor thread (a PeriodicThread, common/periodic_thread.h): every 100 ms declares nodes
//    dead after missed heartbeats, (re)places pending actors.
//  - work_ (a WorkQueue of at most kMaxWorkThreads, which retire after 10 s idle): each actor
//    placement attempt, which calls Node.StartActor (blocking, runs the constructor) without
//    holding mu_; fire-and-forget worker kills; bundle releases nobody waits for.
//  - the Shutdown RPC stops the head on shutdown_ (a OneShotThread: a handler cannot wait for itself).
// Stop() cancels the StartActor calls in flight, stops the placement-group scheduler, stops
// and joins the monitor, drains and joins work_, then stops the servers; ~Head calls
// Stop() and joins shutdown_, so no thread of the head outlives it.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/http_server.h"
#include "common/labels.h"
#include "common/metrics.h"
#include "common/lane.h"
#include "common/one_shot_thread.h"
#include "common/periodic_thread.h"
#include "common/resources.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "head/actors.h"
#include "common/node_table.h"
#include "head/placement_groups.h"
#include "head/slice_index.h"
#include "common/work_queue.h"
#include "head/head_store.h"
#include "head/finished_jobs.h"
#include "head/jobs.h"
#include "head/kv_store.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

class ServeApi;  // head/serve_http.h

struct HeadConfig {
  std::string bind_host = "127.0.0.1";  // the address the head listens on and advertises
  // Where its client port listens instead, when set ("0.0.0.0": every interface, as Ray's GCS;
  // KubeRay's head container reaches it at 127.0.0.1). It still advertises bind_host.
  std::string listen_host;
  const std::string& ListenHost() const { return listen_host.empty() ? bind_host : listen_host; }
  int port = 0;
  std::string session_dir;
  std::string token;
  // A node is declared dead after no heartbeat for the longer of node_timeout_ms and
  // kMissedHeartbeats of the period it beats at (its own, or the head's pacing below).
  int node_timeout_ms = 5000;
  // Heartbeat pacing: the head asks nodes to beat no faster than N / max_heartbeats_per_s
  // seconds (N alive nodes), so the heartbeat load on the head stays bounded at any cluster
  // size (at 10,000 nodes and the default: every 5 s, dead after 25 s of silence).
  int max_heartbeats_per_s = 2000;
  // The watch ring (docs/fault_tolerance.md "Finding dead nodes"): a node reported by its
  // watcher is probed (Node.Ping) twice with this timeout and declared dead if neither reaches it.
  int probe_timeout_ms = 1000;
  // Whole cluster views (to a node that is new, or whose view is older than the change log)
  // cost one NodeRecord per alive node; at most this many records are shipped per second, so
  // that a cluster of thousands coming up cannot starve the heartbeats. Other nodes get deltas.
  int view_records_per_s = 20000;
  // Up to this many alive nodes every heartbeat reply carries the view changes; beyond it only
  // a node that asks (HeartbeatRequest.want_view: it has work waiting that it may spill) gets
  // them, so that an idle cluster ships no views at all (64 node processes on 2 cores: a slice of
  // 16 hosts reserved+released in 26 ms instead of 336 ms, bench/gang_bench.sh).
  int push_view_max_nodes = 64;
  // The durable state (head/head_store.h; "" = memory only). A head started on a store that
  // holds state resumes it (docs/fault_tolerance.md).
  std::string state_path;
  // Instead of opening state_path: a store opened already (a head on etcd elected active opens
  // its store fenced by its leadership: head/head_election.h).
  std::shared_ptr<HeadStore> store;
  // A resumed head waits this long for the nodes and drivers it knew to come back; then the
  // actors and bundles on nodes that did not are handled as on a node's death, and the jobs of
  // drivers that did not are finished.
  int resume_grace_ms = 10000;
  // A bundle a registering node holds that no live group records on it (a group this head does
  // not know, one removed, or one placed elsewhere) is released after this long, if it is still
  // so: longer than a bundle call's deadline (5 s), so a grant in flight is never undone
  // (docs/fault_tolerance.md, "Reconciling bundles").
  int stray_bundle_grace_ms = 10000;
  // Dead nodes stay listed (`torus list nodes`, the state API) up to this many, the longest
  // dead forgotten first (Ray keeps 1,000: maximum_gcs_dead_node_cached_count), so that a
  // cluster whose hosts come and go for weeks keeps a bounded table.
  int keep_dead_nodes = 1000;
  // The HTTP surface (docs/http.md): Ray's Jobs REST API and the health probe, on
  // dashboard_host:dashboard_port. -1: none; 0: any free port. With dashboard_port_fallback a
  // port in use is replaced by a free one (logged), otherwise Start fails.
  std::string dashboard_host = "127.0.0.1";
  int dashboard_port = -1;
  bool dashboard_port_fallback = false;
};

// Ended-task counts per driver as last seen, and those of drivers gone, so that /metrics'
// ended-task counter stays monotonic when drivers exit or miss a scrape (head_metrics.cc).
struct EndedTaskCounts {
  std::map<std::string, std::array<int64_t, 2>> last;  // by driver job id: finished, failed
  std::array<int64_t, 2> gone{};
  std::set<std::string> finished;  // job ids whose final counts are in `gone` (FinishJob)
};

// What a resumed head took over from its durable state.
struct ResumedState {
  size_t actors = 0, placement_groups = 0, drivers = 0, kv_keys = 0, jobs = 0;
  bool any() const { return actors || placement_groups || drivers || kv_keys || jobs; }
};

class Head final : public rpc::Head::Service, private PgCluster, private ActorNodes {
 public:
  explicit Head(HeadConfig cfg);
  ~Head() override;

  Status Start();
  void Wait();
  void Stop();
  std::string address() const { return address_; }
  // The HTTP surface's "host:port" ("" without one). Set by Start.
  std::string dashboard_address() const { return http_ ? http_->address() : ""; }
  // The heads of the cluster (the active first, then the standbys: head/head_election.h), sent
  // to the nodes so they can move to a standby when this head is gone. Any thread.
  void SetHeadAddresses(std::vector<std::string> heads) EXCLUDES(heads_mu_);
  // What Start() resumed (all zero for a new session).
  const ResumedState& resumed() const { return resumed_; }

  grpc::Status RegisterNode(grpc::ServerContext*, const rpc::RegisterNodeRequest*,
                            rpc::RegisterNodeReply*) override;
  grpc::Status UnregisterNode(grpc::ServerContext*, const rpc::UnregisterNodeRequest*,
                              rpc::Empty*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const rpc::HeartbeatRequest*,
                         rpc::HeartbeatReply*) override;
  grpc::Status ReportPeerLost(grpc::ServerContext*, const rpc::PeerLostRequest*, rpc::Empty*) override;
  grpc::Status CreateActor(grpc::ServerContext*, const rpc::CreateActorRequest*,
                           rpc::CreateActorReply*) override;
  grpc::Status ActorStarted(grpc::ServerContext*, const rpc::ActorStartedRequest*,
                            rpc::Empty*) override;
  grpc::Status ActorWorkerDied(grpc::ServerContext*, const rpc::ActorWorkerDiedRequest*,
                               rpc::Empty*) override;
  grpc::Status GetActor(grpc::ServerContext*, const rpc::GetActorRequest*,
                        rpc::GetActorReply*) override;
  grpc::Status KillActor(grpc::ServerContext*, const rpc::KillActorRequest*, rpc::Empty*) override;
  grpc::Status RegisterJob(grpc::ServerContext*, const rpc::JobRequest*, rpc::Empty*) override;
  grpc::Status FinishJob(grpc::ServerContext*, const rpc::JobRequest*, rpc::Empty*) override;
  grpc::Status WatchJob(grpc::ServerContext*, const rpc::JobRequest*,
                        grpc::ServerWriter<rpc::Empty>*) override;
  grpc::Status List(grpc::ServerContext*, const rpc::Empty*, rpc::ListReply*) override;
  grpc::Status Shutdown(grpc::ServerContext*, const rpc::Empty*, rpc::Empty*) override;
  grpc::Status CreatePlacementGroup(grpc::ServerContext*, const rpc::PlacementGroupRecord*,
                                    rpc::CreatePlacementGroupReply*) override;
  grpc::Status RemovePlacementGroup(grpc::ServerContext*, const rpc::PlacementGroupRequest*,
                                    rpc::Empty*) override;
  grpc::Status GetPlacementGroup(grpc::ServerContext*, const rpc::PlacementGroupRequest*,
                                 rpc::GetPlacementGroupReply*) override;
  grpc::Status QuerySlices(grpc::ServerContext*, const rpc::SliceQueryRequest*,
                           rpc::SliceQueryReply*) override;
  grpc::Status KvPut(grpc::ServerContext*, const rpc::KvPutRequest*, rpc::KvPutReply*) override;
  grpc::Status KvGet(grpc::ServerContext*, const rpc::KvGetRequest*, rpc::KvGetReply*) override;
  grpc::Status KvDel(grpc::ServerContext*, const rpc::KvGetRequest*, rpc::KvPutReply*) override;
  grpc::Status KvKeys(grpc::ServerContext*, const rpc::KvGetRequest*, rpc::KvKeysReply*) override;

 private:
  // PgCluster: what the placement-group manager asks of the node table and the actors;
  // ActorNodes: what the actor directory asks of the node table (called with mu_ held).
  uint64_t ViewVersion() override REQUIRES(mu_) { return view_version_; }
  const PlacementIndex& Placement() override REQUIRES(mu_) { return placement_index_; }
  // Alive nodes as slice-query views; index_of maps node id -> index.
  std::vector<NodeView> ViewOfNodes(std::map<std::string, int>* index_of, bool with_labels) REQUIRES(mu_);
  bool NodeMatches(const LabelSelectorTerms& selector, const std::string& node_id) override REQUIRES(mu_);
  std::string NodeAddress(const std::string& node_id) override REQUIRES(mu_);
  const std::map<std::string, NodeEntry>& Nodes() override REQUIRES(mu_) { return nodes_; }
  const NamePool& Names() override REQUIRES(mu_) { return names_; }
  void Charge(const std::string& node_id, const ResourceMap& res) override REQUIRES(mu_);
  const SliceIndex& Slices() override REQUIRES(mu_) { return slice_index_; }
  void ApplyLedger(const NodeCall& call, const BundleReply& reply) override REQUIRES(mu_);
  void OnPgCreated() override REQUIRES(mu_);
  void OnPgRemoved(const std::string& pg_id, const std::string& why) override REQUIRES(mu_);
  void OnPgSliceLost(const std::string& pg_id) override REQUIRES(mu_);

  void FinishJobLocked(const std::string& job_id) REQUIRES(mu_);
  // Durable state (head_restore.cc): opens the store, takes over what it holds, and has every
  // part write its changes to it. Part of Start, before serving.
  Status RestoreState() EXCLUDES(mu_);
  Status StartHttp();  // the HTTP surface, when cfg_.dashboard_port >= 0
  MetricFamilies CollectMetrics() EXCLUDES(mu_, metrics_mu_);  // /metrics' state (head_metrics.cc)
  // A driver's final ended-task counts (its FinishJob): kept for /metrics' counter.
  void NoteDriverEndedTasks(const std::string& job_id, int64_t finished, int64_t failed) EXCLUDES(metrics_mu_);
  // Scrapes serialise on metrics_mu_ (it keeps the ended-task counter monotonic).
  Mutex metrics_mu_ ACQUIRED_AFTER(mu_);
  EndedTaskCounts ended_tasks_ GUARDED_BY(metrics_mu_);
  void SaveDriverJobLocked(const rpc::JobRequest& job, bool finished) REQUIRES(mu_);
  // Once the resume grace has passed: what did not come back is handled as gone.
  void EndResumeGraceLocked() REQUIRES(mu_);
  // the slice and placement indexes follow the node
  void IndexNodeLocked(const std::string& node_id, NodeEntry& n) REQUIRES(mu_);
  // The cluster view for a heartbeat from a node at `version`.
  void FillViewLocked(uint64_t version, rpc::HeartbeatReply* reply) REQUIRES(mu_);
  // A change to the cluster view; `node` (a key of nodes_) when a node changed.
  void BumpView(const std::string* node = nullptr) REQUIRES(mu_);
  // The monitor's tick: nodes silent too long die, pending actors are placed; nullopt once stopping.
  std::optional<std::chrono::milliseconds> MonitorTick() EXCLUDES(mu_);
  // A node is dead: out of the indexes and the view; its actors and bundles are handled.
  void DeclareDeadLocked(const std::string& id, NodeEntry& n, const std::string& why) REQUIRES(mu_);

  // The watch ring (watch_ring.cc). Every alive node watches the next alive node in nodes_'
  // order (node ids are random: the order is random, slice-mates are rarely neighbours), so
  // the ring needs no table of its own. A watcher's report is checked by a probe.
  rpc::WatchTarget WatchTargetLocked(std::map<std::string, NodeEntry>::const_iterator it) const REQUIRES(mu_);
  // The next alive node after `it` in the ring (nodes_.end(): none).
  std::map<std::string, NodeEntry>::const_iterator NextAliveLocked(std::map<std::string, NodeEntry>::const_iterator it) const
      REQUIRES(mu_);
  // The alive node that watches `it` (nodes_.end(): none).
  std::map<std::string, NodeEntry>::const_iterator WatcherOfLocked(std::map<std::string, NodeEntry>::const_iterator it) const
      REQUIRES(mu_);
  // Tells the watcher of `it` its target now (a node joined or died next to it); joins are told
  // at most kJoinPushesPerS a second (the others learn it from their next heartbeat).
  void PushWatchLocked(std::map<std::string, NodeEntry>::const_iterator watched, bool join) REQUIRES(mu_);
  // Tells watcher `w` its target now (Node.SetWatch, from a work thread).
  void PushTargetLocked(std::map<std::string, NodeEntry>::const_iterator w) REQUIRES(mu_);
  // Probes node `id` (a watcher reported it) off the lock; declares it dead if it does not answer.
  void ProbeNode(const std::string& id, const std::string& address, int64_t start_time_ms, const std::string& why)
      EXCLUDES(mu_);
  grpc::Status ReportPeerLostImpl(const rpc::PeerLostRequest& req) EXCLUDES(mu_);
  std::set<std::string> probing_ GUARDED_BY(mu_);  // nodes being probed now
  static constexpr double kJoinPushesPerS = 50;
  double join_push_tokens_ GUARDED_BY(mu_) = kJoinPushesPerS;
  std::chrono::steady_clock::time_point join_push_refill_ GUARDED_BY(mu_){};
  static constexpr std::chrono::milliseconds kMonitorPeriod{100};

  HeadConfig cfg_;
  std::string address_;
  std::unique_ptr<LaneServer> lane_;  // placement-group calls from drivers (docs/wire.md)
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<JobManager> job_manager_;  // submitted jobs (docs/jobs.md), served on our port
  std::unique_ptr<ServeApi> serve_;          // Serve's REST API (serve_http.h): set by StartHttp
  std::unique_ptr<HttpServer> http_;         // after job_manager_ and serve_: stopped and destroyed before them
  static constexpr size_t kMaxWorkThreads = 256;  // actor constructors run on these while they place
  WorkQueue work_{kMaxWorkThreads, 0};  // unbounded queue: Post never waits  // before pg_manager_, which submits to it

  Mutex mu_;
  CondVar stop_cv_;  // Stop began (WatchJob waits on it between its polls)
  // Keys are stable while the node is in the table; a dead node is erased only by
  // ForgetDeadNodesLocked, which first takes every pointer to its key out of view_log_ (the
  // slice index drops a node when it dies).
  std::map<std::string, NodeEntry> nodes_ GUARDED_BY(mu_);
  size_t alive_nodes_ GUARDED_BY(mu_) = 0;
  static constexpr int kMissedHeartbeats = 5;
  // The period nodes are asked to beat at now (0: their own), from alive_nodes_.
  uint32_t PacedHeartbeatMsLocked() const REQUIRES(mu_);
  std::chrono::steady_clock::time_point last_monitor_ GUARDED_BY(mu_){};
  NamePool names_ GUARDED_BY(mu_);  // label keys/values, resource names and totals of nodes_
  size_t totals_live_ GUARDED_BY(mu_) = 0;  // names_'s totals after the last SweepTotals
  // The alive nodes of nodes_ (its lookups read nodes_, under mu_).
  PlacementIndex placement_index_ GUARDED_BY(mu_){names_, [nodes = &nodes_](std::string_view id) {
    auto it = nodes->find(std::string(id));
    return it == nodes->end() ? nullptr : &it->second;
  }};
  uint64_t view_version_ GUARDED_BY(mu_) = 1;
  // The node (or nullptr) that changed at each recent view version, oldest first: heartbeat
  // views are deltas from it. view_log_floor_: versions at or above it are covered.
  std::deque<std::pair<uint64_t, const std::string*>> view_log_ GUARDED_BY(mu_);
  uint64_t view_log_floor_ GUARDED_BY(mu_) = 1;
  // The ids of nodes forgotten while view_log_ may still name them (view version at the time,
  // id), oldest first; dropped once view_log_floor_ passes their version (BumpView).
  std::deque<std::pair<uint64_t, std::string>> forgotten_ids_ GUARDED_BY(mu_);
  // Nodes in the order they died (a node that came back is skipped when its turn comes).
  std::deque<std::string> dead_order_ GUARDED_BY(mu_);
  // Erases the dead nodes beyond cfg_.keep_dead_nodes, the longest dead first, then frees the
  // interned totals no node uses (SweepTotals). Called from the monitor's tick, never while
  // nodes_ is being iterated.
  void ForgetDeadNodesLocked() REQUIRES(mu_);
  double view_tokens_ GUARDED_BY(mu_) = 0;  // view records that may be shipped now (--view-records-per-s)
  std::chrono::steady_clock::time_point view_refill_ GUARDED_BY(mu_);
  // The whole view serialized (HeartbeatReply.view_snapshot) as of snapshot_version_.
  std::string snapshot_ GUARDED_BY(mu_);
  uint64_t snapshot_version_ GUARDED_BY(mu_) = 0;
  size_t snapshot_nodes_ GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point snapshot_built_ GUARDED_BY(mu_);
  std::map<std::string, rpc::JobRequest> jobs_ GUARDED_BY(mu_);
  FinishedJobs finished_jobs_ GUARDED_BY(mu_);  // for the nodes, on their heartbeats
  std::shared_ptr<HeadStore> store_;  // set by Start when cfg_.state_path or cfg_.store is given
  // The heads' addresses for the nodes (SetHeadAddresses), and their version (0: none).
  mutable Mutex heads_mu_;
  std::vector<std::string> heads_ GUARDED_BY(heads_mu_);
  uint64_t heads_version_ GUARDED_BY(heads_mu_) = 0;
  void FillHeads(uint64_t known, google::protobuf::RepeatedPtrField<std::string>* out, uint64_t* version) const
      EXCLUDES(heads_mu_);
  ResumedState resumed_;              // set by Start
  std::chrono::steady_clock::time_point started_at_ = std::chrono::steady_clock::now();  // set by Start
  // Resumed drivers that have not registered again, and when the resume grace ends (max: none).
  std::set<std::string> resumed_jobs_ GUARDED_BY(mu_);
  std::chrono::steady_clock::time_point resume_until_ GUARDED_BY(mu_) = std::chrono::steady_clock::time_point::max();
  SliceIndex slice_index_ GUARDED_BY(mu_);
  KvStore kv_;  // its own lock
  // Placement groups and slice reservations; shares mu_.
  PlacementGroupManager pg_manager_;
  std::atomic<bool> stopping_{false};
  // Actors; shares mu_.
  ActorDirectory actors_;

  Mutex stop_mu_;
  bool stopped_ GUARDED_BY(stop_mu_) = false;
  CondVar stopped_cv_;
  OneShotThread shutdown_;  // runs Stop() for the Shutdown RPC
  PeriodicThread monitor_;
};

}  // namespace torus
