// The head's durable state: opening the store, resuming what it holds, and the end of the
// resume grace (head.h, head_store.h, docs/fault_tolerance.md).
#include <set>

#include "common/logging.h"
#include "head/head.h"

namespace torus {

using Clock = std::chrono::steady_clock;

Status Head::RestoreState() {
  if (cfg_.store) {
    store_ = cfg_.store;
  } else {
    auto store = HeadStore::Open(cfg_.state_path);
    if (!store.ok()) return store.status();
    store_ = std::move(*store);
  }
  auto kv = kv_.AttachStore(store_.get());
  if (!kv.ok()) return kv.status();
  auto actors = store_->LoadAll(StoreKind::kActor);
  if (!actors.ok()) return actors.status();
  auto pgs = store_->LoadAll(StoreKind::kPlacementGroup);
  if (!pgs.ok()) return pgs.status();
  auto drivers = store_->LoadAll(StoreKind::kDriverJob);
  if (!drivers.ok()) return drivers.status();
  MutexLock lock(mu_);
  actors_.AssertHeld();      // it shares mu_
  pg_manager_.AssertHeld();  // it shares mu_
  actors_.AttachStore(store_.get());
  pg_manager_.AttachStore(store_.get());
  resumed_.kv_keys = *kv;
  auto refuse = [&](const Status& s) {
    return Internal("head state " + store_->path() + ": " + s.message() +
                    "; not resuming a session from a damaged state (start afresh with --new-session)");
  };
  std::vector<rpc::JobRequest> driver_jobs;
  for (const auto& [id, bytes] : *drivers) {
    rpc::JobRequest job;
    if (!job.ParseFromString(bytes) || job.job_id() != id) return refuse(Internal("the record of driver " + id + " is garbled"));
    driver_jobs.push_back(job);
  }
  auto np = pg_manager_.RestoreLocked(*pgs);
  if (!np.ok()) return refuse(np.status());
  auto na = actors_.RestoreLocked(*actors);
  if (!na.ok()) return refuse(na.status());
  resumed_.placement_groups = *np;
  resumed_.actors = *na;
  for (const auto& job : driver_jobs) {
    const std::string& id = job.job_id();
    jobs_[id] = job;
    resumed_jobs_.insert(id);
    ++resumed_.drivers;
  }
  if (resumed_.any()) {
    resume_until_ = Clock::now() + std::chrono::milliseconds(cfg_.resume_grace_ms);
    TORUS_LOG(INFO) << "resumed the session's state from " << store_->path() << ": " << resumed_.actors
                    << " actors, " << resumed_.placement_groups << " placement groups, "
                    << resumed_.drivers << " drivers, " << resumed_.kv_keys
                    << " KV keys; waiting up to " << cfg_.resume_grace_ms
                    << " ms for their nodes and drivers to come back";
  }
  return Status::Ok();
}

void Head::SaveDriverJobLocked(const rpc::JobRequest& job, bool finished) {
  if (!store_) return;
  Status s = finished ? store_->Delete(StoreKind::kDriverJob, job.job_id())
                      : store_->Put(StoreKind::kDriverJob, job.job_id(), job.SerializeAsString());
  if (!s.ok()) TORUS_LOG(ERROR) << "driver of job " << job.job_id() << " not saved: " << s.message();
}

void Head::EndResumeGraceLocked() {
  resume_until_ = Clock::time_point::max();
  actors_.AssertHeld();      // it shares mu_
  pg_manager_.AssertHeld();  // it shares mu_
  std::set<std::string> used = actors_.NodesInUseLocked();
  used.merge(pg_manager_.NodesInUseLocked());
  for (const auto& node_id : used) {
    auto it = nodes_.find(node_id);
    if (it != nodes_.end() && it->second.alive) continue;
    TORUS_LOG(WARNING) << "node " << node_id << " did not come back after the head resumed: handled as dead";
    actors_.OnNodeGoneLocked(node_id, "its node " + node_id + " did not come back after the head restarted",
                             /*pending_too=*/true);
    pg_manager_.OnNodeLost(node_id);
  }
  actors_.EndResumeGraceLocked();
  for (const auto& job_id : resumed_jobs_) {
    TORUS_LOG(WARNING) << "driver of job " << job_id << " did not come back after the head resumed";
    FinishJobLocked(job_id);
  }
  resumed_jobs_.clear();
}

}  // namespace torus
