// JobManager's API (jobs.h): submit, query, stop, delete and read logs, and the gRPC service's
// thin handlers over it. The supervision of a running job is in jobs.cc.
#include <algorithm>
#include <filesystem>
#include <fstream>

#include "common/wall_clock.h"
#include "common/ids.h"
#include "common/labels.h"
#include "common/logging.h"
#include "common/resources.h"
#include "common/rpc.h"
#include "common/wire_states.h"
#include "head/jobs.h"
#include "tpu/gang_env.h"
#include "tpu/topology.h"

namespace torus {

namespace {


// The reservation a gang job asks for: the same bundles and selectors as
// torus::tpu::CreateSlicePlacementGroup with default options (one bundle {CPU: 1, TPU: c} per
// host, slice-major; the slice's head unit with host 0's bundle).
StatusOr<rpc::PlacementGroupRecord> SliceRecord(const rpc::JobSubmitRequest& req, const std::string& job_id) {
  int num_slices = req.num_slices() > 0 ? req.num_slices() : 1;
  auto shape = tpu::ComputeSliceShape(req.accelerator_version(), req.slice_topology(), std::nullopt);
  if (!shape.ok()) return shape.status();
  auto layout = tpu::ComputeBundleLayout(*shape, num_slices, "SPREAD");
  if (!layout.ok()) return layout.status();
  auto gen = tpu::NormalizeVersion(req.accelerator_version());
  if (!gen.ok()) return gen.status();
  rpc::PlacementGroupRecord rec;
  rec.set_strategy("SPREAD");
  rec.set_job_id(job_id);
  auto* sl = rec.mutable_slice();
  sl->set_topology(req.slice_topology());
  sl->set_accelerator_version(req.accelerator_version());
  sl->set_num_slices(num_slices);
  sl->set_timeout_ms(req.slice_wait_timeout_ms() > 0 ? req.slice_wait_timeout_ms() : -1);
  for (int i = 0; i < layout->total_bundles; ++i) {
    auto* b = rec.add_bundles();
    ResourceMap amounts{{"CPU", 1}, {"TPU", layout->tpu_per_bundle}};
    if (i % layout->bundles_per_slice == 0) amounts["TPU-" + shape->pod_type + "-head"] = 1;
    ToProto(amounts, b->mutable_resources());
    auto* t = b->add_label_selector();
    t->set_key(std::string(tpu::kLabelPodType));
    t->set_expr(shape->pod_type);
    t = b->add_label_selector();
    t->set_key(std::string(tpu::kLabelAcceleratorType));
    t->set_expr(tpu::AcceleratorTypeValue(*gen));
  }
  return rec;
}

// A submission id names the job's log file: letters, digits, '_', '-', '.'; not "." or "..".
Status CheckSubmissionId(const std::string& id) {
  if (id.size() > 128) return InvalidArgument("submission_id is longer than 128 characters");
  if (id == "." || id == "..") return InvalidArgument("submission_id '" + id + "' is not allowed");
  for (char c : id) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
              c == '-' || c == '.';
    if (!ok) return InvalidArgument("submission_id '" + id + "' may hold only letters, digits, '_', '-' and '.'");
  }
  return Status::Ok();
}

template <typename Reply>
grpc::Status Answer(const Status& s, Reply* reply) {
  SetError(reply->mutable_error(), s);
  return grpc::Status::OK;
}

}  // namespace

// ------------------------------------------------------------------------------- the API

StatusOr<rpc::JobRecord> JobManager::Submit(const rpc::JobSubmitRequest& in) {
  rpc::JobSubmitRequest req = in;
  if (!req.shell_command().empty()) {
    if (req.entrypoint_size() > 0) return InvalidArgument("a job gives either a command or a shell command, not both");
    req.add_entrypoint("/bin/sh");
    req.add_entrypoint("-c");
    req.add_entrypoint(req.shell_command());
  }
  if (req.entrypoint_size() == 0 || req.entrypoint(0).empty()) {
    return InvalidArgument("a job needs a command (after --)");
  }
  if (req.max_retries() < 0 || req.max_retries() > 1000) return InvalidArgument("--max-retries must be from 0 to 1000");
  if (req.num_slices() > 1024) return InvalidArgument("num_slices must be at most 1024");
  if (!req.driver_label_selector().empty()) {
    auto sel = ParseLabelSelector({req.driver_label_selector().begin(), req.driver_label_selector().end()});
    if (!sel.ok()) return InvalidArgument("the driver's label selector: " + sel.status().message());
  }
  if (auto s = ValidateResourceSet(req.driver_resources(), "the driver's resources"); !s.ok()) return s;
  std::string id = req.submission_id().empty() ? "job_" + RandomHex(5) : req.submission_id();
  if (auto s = CheckSubmissionId(id); !s.ok()) return s;
  Job job;
  if (!req.slice_topology().empty() || !req.accelerator_version().empty()) {
    if (req.slice_topology().empty() || req.accelerator_version().empty()) {
      return InvalidArgument("--slice and --accelerator go together");
    }
    if (req.num_slices() < 0) return InvalidArgument("num_slices must be at least 1");
    auto rec = SliceRecord(req, id);
    if (!rec.ok()) return rec.status();
    job.slice_request = *rec;
  }
  auto& r = job.rec;
  r.set_job_id(id);
  r.set_state(rpc::JobRecord::PENDING);
  for (const auto& a : req.entrypoint()) r.add_entrypoint(a);
  r.set_shell_command(req.shell_command());
  *r.mutable_metadata() = req.metadata();
  r.set_runtime_env_json(req.runtime_env_json());
  r.set_working_dir(req.working_dir());
  r.set_max_retries(req.max_retries());
  r.set_exit_code(-1);
  r.set_submitted_ms(WallClockMs());
  r.set_slice_topology(req.slice_topology());
  r.set_accelerator_version(req.accelerator_version());
  r.set_num_slices(job.slice_request.has_slice() ? job.slice_request.slice().num_slices() : 0);
  job.req = std::move(req);
  job.log_path = log_dir_ + "/job-" + id + ".log";
  MutexLock lock(mu_);
  if (stopping_) return Unavailable("the head is shutting down");
  if (!accepting_) return Unavailable("the head is resuming its jobs; try again in a moment");
  if (jobs_.count(id)) return AlreadyExists("a job with submission_id '" + id + "' exists already");
  {
    std::ofstream create(job.log_path, std::ios::trunc);
  }
  TORUS_LOG(INFO) << "job " << id << " submitted: "
                  << (r.shell_command().empty() ? r.entrypoint(0) : r.shell_command())
                  << (r.slice_topology().empty() ? "" : " on " + r.accelerator_version() + " " + r.slice_topology());
  TrimFinishedLocked();
  auto& stored = jobs_[id] = std::move(job);
  SaveLocked(id);
  stored.supervisor = std::thread([this, id] { Supervise(id); });
  return stored.rec;
}

StatusOr<rpc::JobRecord> JobManager::Get(const std::string& id) {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job '" + id + "'");
  return it->second.rec;
}

std::vector<rpc::JobRecord> JobManager::List() {
  std::vector<rpc::JobRecord> out;
  {
    MutexLock lock(mu_);
    out.reserve(jobs_.size());
    for (const auto& [id, j] : jobs_) out.push_back(j.rec);
  }
  std::stable_sort(out.begin(), out.end(), [](const rpc::JobRecord& a, const rpc::JobRecord& b) {
    return a.submitted_ms() < b.submitted_ms();
  });
  return out;
}

StatusOr<rpc::JobRecord> JobManager::RequestStop(const std::string& id) {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job '" + id + "'");
  if (!IsTerminal(it->second.rec.state())) {
    it->second.stop_requested = true;
    cv_.NotifyAll();
  }
  return it->second.rec;
}

Status JobManager::Delete(const std::string& id) {
  MutexLock lock(mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return NotFound("no job '" + id + "'");
  if (!IsTerminal(it->second.rec.state())) {
    return FailedPrecondition("job '" + id + "' is " + StateName(it->second.rec.state()) +
                              ": only a finished job can be deleted (stop it first)");
  }
  if (cfg_.store) {
    if (auto s = cfg_.store->Delete(StoreKind::kJob, id); !s.ok()) {
      return Unavailable("job '" + id + "' could not be deleted from the head's store: " + s.message());
    }
  }
  // All under mu_, so that a job submitted again with this id right after keeps its new log.
  // The supervisor of a finished job has set its final state and returns without mu_: the join
  // is short.
  if (it->second.supervisor.joinable()) it->second.supervisor.join();
  {
    MutexLock log_lock(log_mu_);
    progress_.erase(id);
  }
  std::error_code ec;
  std::filesystem::remove(it->second.log_path, ec);
  jobs_.erase(it);
  cv_.NotifyAll();
  TORUS_LOG(INFO) << "job " << id << " deleted";
  return Status::Ok();
}

StatusOr<JobManager::LogRead> JobManager::ReadLog(const std::string& id, uint64_t offset, size_t max_bytes) {
  LogRead out;
  std::string path;
  {
    // The record is read before the file, so once it is terminal the bytes read reach the end.
    MutexLock lock(mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return NotFound("no job '" + id + "'");
    out.job = it->second.rec;
    path = it->second.log_path;
  }
  std::error_code ec;
  uint64_t size = std::filesystem::file_size(path, ec);
  if (ec || size <= offset) return out;  // nothing new (most wake-ups of a tail)
  std::ifstream f(path, std::ios::binary);
  if (!f) return out;
  f.seekg(static_cast<std::streamoff>(offset));
  if (!f) return out;
  out.data.resize(static_cast<size_t>(std::min<uint64_t>(max_bytes, size - offset)));
  f.read(out.data.data(), static_cast<std::streamsize>(out.data.size()));
  out.data.resize(static_cast<size_t>(std::max<std::streamsize>(f.gcount(), 0)));
  return out;
}

void JobManager::WaitForChange(std::chrono::milliseconds d) {
  MutexLock lock(mu_);
  if (stopping_) return;
  cv_.WaitFor(lock, d);
}

// ------------------------------------------------------------------------------- gRPC

grpc::Status JobManager::SubmitJob(grpc::ServerContext* ctx, const rpc::JobSubmitRequest* req,
                                   rpc::JobReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  auto rec = Submit(*req);
  if (!rec.ok()) return Answer(rec.status(), reply);
  *reply->mutable_job() = std::move(*rec);
  return grpc::Status::OK;
}

grpc::Status JobManager::GetJob(grpc::ServerContext* ctx, const rpc::JobIdRequest* req, rpc::JobReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  auto rec = Get(req->job_id());
  if (!rec.ok()) return Answer(rec.status(), reply);
  *reply->mutable_job() = std::move(*rec);
  return grpc::Status::OK;
}

grpc::Status JobManager::ListJobs(grpc::ServerContext* ctx, const rpc::Empty*, rpc::JobListReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  for (auto& r : List()) *reply->add_jobs() = std::move(r);
  return grpc::Status::OK;
}

grpc::Status JobManager::StopJob(grpc::ServerContext* ctx, const rpc::JobIdRequest* req, rpc::JobReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  auto rec = RequestStop(req->job_id());
  if (!rec.ok()) return Answer(rec.status(), reply);
  *reply->mutable_job() = std::move(*rec);
  return grpc::Status::OK;
}

grpc::Status JobManager::DeleteJob(grpc::ServerContext* ctx, const rpc::JobIdRequest* req,
                                   rpc::JobDeleteReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  auto s = Delete(req->job_id());
  reply->set_deleted(s.ok());
  return Answer(s, reply);
}

grpc::Status JobManager::JobLogs(grpc::ServerContext* ctx, const rpc::JobLogsRequest* req,
                                 grpc::ServerWriter<rpc::JobLogChunk>* writer) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  uint64_t offset = req->offset();
  while (!ctx->IsCancelled()) {
    auto got = ReadLog(req->job_id(), offset, 64 * 1024);
    if (!got.ok()) {
      if (offset == req->offset()) return grpc::Status(grpc::StatusCode::NOT_FOUND, got.status().message());
      break;  // deleted while followed
    }
    if (!got->data.empty()) {
      rpc::JobLogChunk c;
      c.set_offset(offset);
      c.set_data(std::move(got->data));
      offset += c.data().size();
      if (!writer->Write(c)) return grpc::Status::OK;
      continue;  // read on until the end before deciding whether it is done
    }
    if (!req->follow() || IsTerminal(got->job.state()) || stopping_) {
      rpc::JobLogChunk last;
      last.set_offset(offset);
      last.set_done(true);
      *last.mutable_job() = std::move(got->job);
      writer->Write(last);
      return grpc::Status::OK;
    }
    WaitForChange(std::chrono::milliseconds(50));
  }
  return grpc::Status::OK;
}

}  // namespace torus
