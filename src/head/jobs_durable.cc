// JobManager's durable state (jobs.h): saving a job's record and log progress, taking the jobs
// over in a resumed head, and tailing on the attempt a previous head started.
#include <algorithm>
#include <filesystem>
#include <set>

#include "common/logging.h"
#include "common/rpc.h"
#include "common/wire_states.h"
#include "head/jobs.h"

namespace torus {

void JobManager::SaveLocked(const std::string& id) {
  if (!cfg_.store) return;
  const Job& j = jobs_[id];
  rpc::DurableJob d;
  *d.mutable_rec() = j.rec;
  *d.mutable_req() = j.req;
  *d.mutable_slice_request() = j.slice_request;
  d.set_log_path(j.log_path);
  {
    MutexLock lock(log_mu_);
    auto it = progress_.find(id);
    if (it != progress_.end()) {
      d.set_log_size(it->second.log_size);
      for (uint64_t o : it->second.offsets) d.add_offsets(o);
    }
  }
  if (auto s = cfg_.store->Put(StoreKind::kJob, id, d.SerializeAsString()); !s.ok()) {
    TORUS_LOG(ERROR) << "job " << id << " not saved: " << s.message();
  }
}

void JobManager::Save(const std::string& id) {
  MutexLock lock(mu_);
  SaveLocked(id);
}

StatusOr<size_t> JobManager::Restore() {
  if (!cfg_.store) return size_t{0};
  auto records = cfg_.store->LoadAll(StoreKind::kJob);
  if (!records.ok()) return records.status();
  std::vector<rpc::DurableJob> jobs;
  for (const auto& [id, bytes] : *records) {
    rpc::DurableJob d;
    if (!d.ParseFromString(bytes) || d.rec().job_id() != id) {
      return Internal("head state " + cfg_.store->path() + ": the record of job " + id + " is garbled");
    }
    jobs.push_back(std::move(d));
  }
  MutexLock lock(mu_);
  for (auto& d : jobs) {
    const std::string id = d.rec().job_id();
    Job& j = jobs_[id];
    j.rec = d.rec();
    j.req = d.req();
    j.slice_request = d.slice_request();
    j.log_path = d.log_path();
    const bool running = j.rec.state() == rpc::JobRecord::RUNNING && j.rec.processes_size() > 0;
    if (running) {
      // Cut the log back to what the saved offsets account for: the tail copies the rest again.
      std::error_code ec;
      auto size = std::filesystem::file_size(j.log_path, ec);
      if (!ec && size > d.log_size()) std::filesystem::resize_file(j.log_path, d.log_size(), ec);
      if (ec) TORUS_LOG(WARNING) << "job " << id << ": log " << j.log_path << ": " << ec.message();
      MutexLock plock(log_mu_);
      progress_[id] = {d.log_size(), {d.offsets().begin(), d.offsets().end()}};
    }
    if (running) {
      j.supervisor = std::thread([this, id] { Supervise(id, /*resume=*/true); });
    } else if (j.rec.state() == rpc::JobRecord::PENDING) {
      // An attempt that had not started its processes starts over; what its start calls may
      // have started is stopped first, and a reservation it made goes.
      std::string pg = j.rec.placement_group_id();
      std::set<std::string> nodes;
      for (const auto& p : j.rec.processes()) nodes.insert(p.node_address());
      j.rec.clear_processes();
      j.supervisor = std::thread([this, id, pg, nodes] {
        for (const auto& address : nodes) {
          rpc::JobProcessRef ref;
          ref.set_job_id(id);
          rpc::Empty e;
          auto ctx = NewContext(cfg_.token, 5000);
          (void)rpc::JobRunner::NewStub(GetChannel(address))->StopProcess(ctx.get(), ref, &e);
        }
        RemoveReservation(pg);
        Supervise(id);
      });
    }
    TORUS_LOG(INFO) << "job " << id << " resumed: " << StateName(j.rec.state());
  }
  return jobs.size();
}

JobManager::AttemptResult JobManager::ResumeAttempt(const std::string& id) {
  Attempt a;
  a.id = id;
  {
    MutexLock lock(mu_);
    const Job& j = jobs_[id];
    a.req = j.req;
    a.gang = j.slice_request.has_slice();
    a.pg_id = j.rec.placement_group_id();
    for (const auto& p : j.rec.processes()) {
      Target t;
      t.rank = p.rank();
      t.node_id = p.node_id();
      t.node_address = p.node_address();
      t.host = p.host();
      a.targets.push_back(t);
      rpc::JobProcessStartReply started;
      started.set_process_id(p.process_id());
      started.set_pid(p.pid());
      started.set_started_ms(p.started_ms());
      a.started.push_back(started);
    }
  }
  {
    MutexLock lock(log_mu_);
    a.start_offsets = progress_[id].offsets;
  }
  a.start_offsets.resize(a.targets.size(), 0);
  AttemptResult result = AwaitProcesses(a);
  RemoveReservation(a.pg_id);
  return result;
}

void JobManager::TrimFinishedLocked() {
  std::vector<std::pair<int64_t, std::string>> finished;  // (submitted, id)
  for (const auto& [id, j] : jobs_) {
    if (IsTerminal(j.rec.state())) finished.emplace_back(j.rec.submitted_ms(), id);
  }
  if (finished.size() <= kKeepFinishedJobs) return;
  std::sort(finished.begin(), finished.end());
  for (size_t i = 0; i + kKeepFinishedJobs < finished.size(); ++i) {
    const std::string& id = finished[i].second;
    Job& j = jobs_[id];
    // Its supervisor has returned (the job is finished): the join does not wait.
    if (j.supervisor.joinable()) j.supervisor.join();
    if (cfg_.store) (void)cfg_.store->Delete(StoreKind::kJob, id);
    {
      MutexLock lock(log_mu_);
      progress_.erase(id);
    }
    jobs_.erase(id);
  }
}

}  // namespace torus
