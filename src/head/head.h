// The head daemon (`torus head`): the cluster's control plane. Holds the node table (membership,
// labels, resources, liveness by heartbeat), the actor directory (placement, names per namespace,
// restarts, deaths) and the job table. Not on the task hot path: tasks are placed by the nodes.
//
// THREADS
//  - gRPC sync-server threads run the handlers; all state is guarded by mu_.
//  - monitor thread: declares nodes dead after missed heartbeats, (re)places pending actors.
//  - one short-lived thread per actor placement attempt, which calls Node.StartActor (blocking,
//    runs the constructor) without holding mu_.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "common/labels.h"
#include "common/lane.h"
#include "common/resources.h"
#include "common/status.h"
#include "head/node_table.h"
#include "head/slice_index.h"
#include "head/jobs.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

struct HeadConfig {
  std::string bind_host = "127.0.0.1";
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
  // Whole cluster views (to a node that is new, or whose view is older than the change log)
  // cost one NodeRecord per alive node; at most this many records are shipped per second, so
  // that a cluster of thousands coming up cannot starve the heartbeats. Other nodes get deltas.
  int view_records_per_s = 20000;
  // Up to this many alive nodes every heartbeat reply carries the view changes; beyond it only
  // a node that asks (HeartbeatRequest.want_view: it has work waiting that it may spill) gets
  // them, so that an idle cluster ships no views at all (64 node processes on 2 cores: a slice of
  // 16 hosts reserved+released in 26 ms instead of 336 ms, bench/gang_bench.sh).
  int push_view_max_nodes = 64;
};

class Head final : public rpc::Head::Service {
 public:
  explicit Head(HeadConfig cfg);
  ~Head() override;

  Status Start();
  void Wait();
  void Stop();
  std::string address() const { return address_; }

  grpc::Status RegisterNode(grpc::ServerContext*, const rpc::RegisterNodeRequest*,
                            rpc::RegisterNodeReply*) override;
  grpc::Status UnregisterNode(grpc::ServerContext*, const rpc::UnregisterNodeRequest*,
                              rpc::Empty*) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const rpc::HeartbeatRequest*,
                         rpc::HeartbeatReply*) override;
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

 private:
  struct PgEntry {
    rpc::PlacementGroupRecord rec;
    std::vector<LabelSelectorTerms> selectors;  // per bundle
    std::chrono::steady_clock::time_point pending_since;
    bool scheduling = false;     // the scheduler thread is preparing it on nodes
    uint64_t tried_view = 0;     // view version of the last failed attempt
    // After a failed prepare/commit: try again from then on even if the view has not changed.
    std::chrono::steady_clock::time_point retry_at = std::chrono::steady_clock::time_point::max();
    bool feasible = true;        // could be placed on the cluster's totals
    std::chrono::steady_clock::time_point deadline = std::chrono::steady_clock::time_point::max();
  };
  // Placement-group scheduler thread: one group at a time, in arrival order (docs/placement_groups.md).
  void PgLoop();
  // Places the first placeable group in the queue (prepare/commit on its nodes, with mu_
  // released meanwhile); false when none can be placed now. Require mu_ held by `lock` and
  // !pg_scheduling_: one group is scheduled at a time, by the scheduler thread or inline by
  // CreatePlacementGroup when the queue was empty.
  bool SchedulePgOnce(std::unique_lock<std::mutex>& lock);
  // A node's answer to a bundle call: the call's status and, when that is OK, the
  // rpc::PrepareBundlesReply read by hand from its bytes (ParseBundleReply in head.cc; no
  // protobuf map built per reply).
  struct BundleReply {
    grpc::Status status;
    bool ok = false;
    std::string error;
    uint64_t ledger_seq = 0;
    std::string raw;  // the serialised reply
    struct Amount {
      uint32_t name_offset = 0, name_size = 0;  // the resource name, in `raw`
      double value = 0;
    };
    std::vector<Amount> available;
    std::string_view Name(const Amount& a) const {
      return std::string_view(raw).substr(a.name_offset, a.name_size);
    }
  };
  // Reads r->raw (a serialised rpc::PrepareBundlesReply) into r's fields; false if garbled.
  static bool ParseBundleReply(BundleReply* r);
  // Takes a node's ledger from a bundle reply unless we hold a newer one (require mu_).
  void ApplyLedgerLocked(const std::string& node_address, const BundleReply& reply);
  // One bundle call to one node: its address and the serialised rpc::BundlesRequest, written
  // straight from the group's record (BundlesPayload / ReleasePayload in head.cc) instead of
  // building, copying and destroying request messages per node.
  struct NodeCall {
    std::string address;
    std::string payload;
  };
  // Marks a group REMOVED (require mu_); returns the releases of its placed bundles.
  std::vector<NodeCall> RemovePgLocked(PgEntry& e, const std::string& why);
  // Releases bundles on nodes, all at once, and takes their ledgers (no lock held).
  void ReleaseOnNodes(const std::vector<NodeCall>& what);
  enum class BundleOp { kPrepare, kCommit, kRelease };
  // One bundle call per NodeCall, issued concurrently; results in order. A node in this
  // process is called directly. No lock held.
  std::vector<BundleReply> CallNodes(BundleOp op, const std::vector<NodeCall>& calls);
  void OnNodeLostForPgs(const std::string& node_id);  // require mu_
  void FinishJobLocked(const std::string& job_id);     // require mu_
  // Alive nodes as placement views (require mu_); index_of maps node id -> index.
  std::vector<struct NodeView> ViewOfNodes(std::map<std::string, int>* index_of, bool with_labels);
  // Node id per bundle for a slice reservation, choosing whole idle slices (from the slice
  // index) for the slice indices not granted yet; fills *slice_names. Require mu_.
  std::optional<std::vector<std::string>> PlaceSlices(PgEntry& e, std::vector<std::string>* slice_names,
                                                      std::string* reason);
  // MEGASCALE_* environment of each bundle of a slice reservation being granted (require mu_).
  void SetSliceEnvLocked(PgEntry& e, const std::vector<std::string>& placed_ids);
  // the slice index follows the node (require mu_)
  void IndexNodeLocked(const std::string& node_id, const NodeEntry& n);
  // The cluster view for a heartbeat from a node at `version` (require mu_).
  void FillViewLocked(uint64_t version, rpc::HeartbeatReply* reply);
  struct ActorEntry {
    rpc::ActorRecord rec;
    rpc::CreateActorRequest spec;
    bool placing = false;      // a placement thread is running
    bool no_restart = false;   // killed with no_restart
    std::string pending_reason;
    LabelSelectorTerms selector;
  };

  // Require mu_. A change to the cluster view; `node` (a key of nodes_) when a node changed.
  void BumpView(const std::string* node = nullptr);
  void SchedulePendingActors();
  void PlaceActor(const std::string& actor_id, const std::string& node_id,
                  const std::string& node_address);  // runs on its own thread, no lock
  void OnActorWorkerGone(ActorEntry& a, const std::string& cause, bool intentional);
  void KillActorWorker(const rpc::ActorRecord& rec);  // fire-and-forget RPC to the node
  void MonitorLoop();

  HeadConfig cfg_;
  std::string address_;
  std::unique_ptr<LaneServer> lane_;  // placement-group calls from drivers (docs/wire.md)
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<JobManager> job_manager_;  // submitted jobs (docs/jobs.md), served on our port

  std::mutex mu_;
  std::condition_variable cv_;  // actor state changes
  // guarded by mu_
  std::map<std::string, NodeEntry> nodes_;  // never erased: keys are stable
  size_t alive_nodes_ = 0;
  static constexpr int kMissedHeartbeats = 5;
  // The period nodes are asked to beat at now (0: their own), from alive_nodes_ (require mu_).
  uint32_t PacedHeartbeatMsLocked() const;
  std::chrono::steady_clock::time_point last_monitor_{};
  NamePool names_;                          // label keys/values, resource names of nodes_
  // address -> node id; each key views the address string of the entry it maps to
  std::unordered_map<std::string_view, const std::string*> node_by_address_;
  uint64_t view_version_ = 1;
  // The node (or nullptr) that changed at each recent view version, oldest first: heartbeat
  // views are deltas from it. view_log_floor_: versions at or above it are covered.
  std::deque<std::pair<uint64_t, const std::string*>> view_log_;
  uint64_t view_log_floor_ = 1;
  double view_tokens_ = 0;  // view records that may be shipped now (--view-records-per-s)
  std::chrono::steady_clock::time_point view_refill_;
  // The whole view serialized (HeartbeatReply.view_snapshot) as of snapshot_version_.
  std::string snapshot_;
  uint64_t snapshot_version_ = 0;
  size_t snapshot_nodes_ = 0;
  std::chrono::steady_clock::time_point snapshot_built_;
  std::unordered_map<std::string, ActorEntry> actors_;
  std::map<std::pair<std::string, std::string>, std::string> named_actors_;  // (ns, name) -> id
  std::map<std::string, rpc::JobRequest> jobs_;
  std::map<std::string, PgEntry> pgs_;
  std::deque<std::string> pg_queue_;  // PENDING / RESCHEDULING groups, arrival order
  // REMOVED groups in removal order: the oldest are forgotten beyond kKeepRemovedPgs, so a head
  // serving reservations for weeks does not grow with every one it ever made.
  std::deque<std::string> removed_pgs_;
  static constexpr size_t kKeepRemovedPgs = 1000;
  void TrimRemovedPgsLocked();
  std::map<std::pair<std::string, std::string>, std::string> named_pgs_;  // (ns, name) -> id
  std::map<std::string, std::string> slice_holder_;
  SliceIndex slice_index_;  // slice name -> reservation (pg) id
  std::condition_variable pg_cv_;
  bool pg_scheduling_ = false;  // a group is being prepared/committed (mu_ released meanwhile)
  std::thread pg_thread_;

  std::atomic<bool> stopping_{false};
  std::mutex stop_mu_;
  bool stopped_ = false;
  std::condition_variable stopped_cv_;
  std::thread monitor_thread_;
};

}  // namespace torus
