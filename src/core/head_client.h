// The core worker's client of the head: the job of a driver (registered, watched, finished),
// actors (create, look up, kill, report an exit), placement groups and slice reservations, the
// key-value store and the cluster listing. It knows nothing of tasks, objects or connections to
// workers; the core worker composes it.
//
// Errors: calls that feed the API throw internal::RayException with the head's reason (the
// exception the header-only API and the Python layer turn into Ray's types); calls the core worker
// decides on itself return Status/StatusOr.
//
// THREADS
//  - every method may be called from any thread, concurrently; each blocks for its RPCs only and
//    takes no lock of the core worker. The gRPC stub is thread-safe.
//  - created_ (groups placed while CreatePlacementGroup ran) is guarded by mu_.
//  - a driver's WatchJob call is held open by watch_thread_, started by RegisterJob and joined by
//    FinishJob (or the destructor). When the call breaks (the head restarted), the thread
//    registers the job again and watches again, with backoff, until FinishJob; watch_ctx_ and
//    watch_stop_ are guarded by watch_mu_.
//  - calls that are safe to repeat wait for a restarting head (RetryWhileHeadAway), on the
//    calling thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "common/head_addresses.h"
#include "common/resources.h"
#include "common/status.h"
#include "common/rpc.h"
#include "common/thread_annotations.h"
#include "proto/torus.grpc.pb.h"
#include "torus/internal/runtime.h"

namespace torus::core {

class HeadClient {
 public:
  // `refresh` (optional) asks the local node which heads it knows now (the active first); it
  // is called, at most once a second, when the current head cannot be reached, so a long-lived
  // worker or driver follows a failover to a head started after it (docs/fault_tolerance.md).
  HeadClient(std::string address, std::string token,
             std::function<std::vector<std::string>()> refresh = nullptr);
  ~HeadClient();
  HeadClient(const HeadClient&) = delete;
  HeadClient& operator=(const HeadClient&) = delete;

  // The head called now (one of those given: "A,B" names a head and its standbys).
  std::string address() const { return heads_.current(); }

  // Drivers: registers the job and holds a WatchJob call open, so the head notices when this
  // process dies. FinishJob marks it finished (best effort) and ends the watch.
  Status RegisterJob(const rpc::JobRequest& job);
  // `tasks_finished`/`tasks_failed`: the tasks this driver ended (for the head's metrics).
  void FinishJob(const std::string& job_id, int64_t tasks_finished = 0, int64_t tasks_failed = 0);

  // Actors.
  void CreateActor(const rpc::CreateActorRequest& req);  // throws why the head refused
  // One lookup (with the request's own wait for ALIVE).
  StatusOr<rpc::GetActorReply> GetActor(const rpc::GetActorRequest& req);
  // The id of the live actor named `name` in `ray_namespace`; "" if none.
  std::string GetNamedActor(const std::string& name, const std::string& ray_namespace);
  void KillActor(const std::string& actor_id, bool no_restart);
  // Best effort: the actor on `worker_id` exits on purpose (ray::ExitActor()).
  void ReportActorExit(const std::string& actor_id, const std::string& worker_id);

  // Placement groups and slice reservations. `ray_namespace` and `job_id` fill what the spec
  // leaves empty.
  std::string CreatePlacementGroup(const internal::PlacementGroupSpec& spec,
                                   const std::string& ray_namespace, const std::string& job_id);
  void RemovePlacementGroup(const std::string& id);
  bool WaitPlacementGroup(const std::string& id, int timeout_seconds);
  internal::PlacementGroupInfo GetPlacementGroupInfo(const std::string& id, const std::string& name,
                                                     const std::string& ray_namespace);
  std::vector<internal::PlacementGroupInfo> GetAllPlacementGroups();
  internal::SliceQueryResult QuerySlices(const std::string& topology, const std::string& version,
                                         int chips_per_vm, const std::string& slice_name);
  // The node address of a bundle of group `pg_id` able to hold `res` (bundle_index -1: any;
  // `spread` then picks among the fitting ones). Waits while the group is pending, until it is
  // placed, removed, or `stop` is set.
  StatusOr<std::string> BundleNode(const std::string& pg_id, int bundle_index,
                                   const ResourceMap& res, int spread,
                                   const std::atomic<bool>& stop);

  // The key-value store (head/kv_store.h).
  bool KvPut(const std::string& ns, const std::string& key, const std::string& value, bool overwrite);
  std::optional<std::string> KvGet(const std::string& ns, const std::string& key);
  bool KvDel(const std::string& ns, const std::string& key);
  std::vector<std::string> KvKeys(const std::string& ns, const std::string& prefix);
  // Nodes, actors, jobs and placement groups, as the head lists them.
  rpc::ListReply ListCluster();

 private:
  // The head and its standbys; a call that cannot reach the current one moves to the next.
  HeadAddresses heads_;
  const std::string token_;
  const std::function<std::vector<std::string>()> refresh_;
  std::atomic<int64_t> refreshed_ms_{0};  // steady clock of the last refresh
  // The current head `failed` could not be reached: the next one, after a refresh from the node.
  void HeadFailed(const std::string& failed);
  std::unique_ptr<rpc::Head::Stub> Stub() const { return rpc::Head::NewStub(GetChannel(heads_.current())); }

  Mutex mu_;
  std::unordered_set<std::string> created_ GUARDED_BY(mu_);

  // While the head is away (a call fails UNAVAILABLE: it is restarting, docs/fault_tolerance.md)
  // `call` is tried again, with backoff from 50 ms to 1 s, for up to kHeadAwayMs; then its
  // last status is returned. Only for calls that are safe to repeat.
  static constexpr int kHeadAwayMs = 30000;
  grpc::Status RetryWhileHeadAway(const std::function<grpc::Status()>& call);
  // One unary rpc::Head call on a fresh context with `deadline_ms`, under RetryWhileHeadAway.
  template <class Req, class Rep>
  grpc::Status Call(grpc::Status (rpc::Head::Stub::*method)(grpc::ClientContext*, const Req&, Rep*),
                    const Req& req, Rep* reply, int64_t deadline_ms) {
    return RetryWhileHeadAway([&] {
      auto ctx = NewContext(token_, deadline_ms);
      reply->Clear();
      return (Stub().get()->*method)(ctx.get(), req, reply);
    });
  }
  void WatchLoop(rpc::JobRequest job);  // watch_thread_
  void StopWatching() EXCLUDES(watch_mu_);
  // The watch's state. Held across a re-registration, so that once FinishJob set watch_stop_
  // no registration can follow its FinishJob call.
  Mutex watch_mu_;
  std::shared_ptr<grpc::ClientContext> watch_ctx_ GUARDED_BY(watch_mu_);  // the open WatchJob call
  bool watch_stop_ GUARDED_BY(watch_mu_) = false;
  CondVar watch_cv_;  // watch_stop_ set
  std::thread watch_thread_;
};

}  // namespace torus::core
