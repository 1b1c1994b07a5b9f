#include "head/jobs.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>

#include "common/ids.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/wire_states.h"
#include "tpu/gang_env.h"
#include "tpu/topology.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}


std::string HostOf(const std::string& address) {
  auto colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

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
    auto& amounts = *b->mutable_resources()->mutable_amounts();
    amounts["CPU"] = 1;
    amounts["TPU"] = layout->tpu_per_bundle;
    if (i % layout->bundles_per_slice == 0) amounts["TPU-" + shape->pod_type + "-head"] = 1;
    auto* t = b->add_label_selector();
    t->set_key(std::string(tpu::kLabelPodType));
    t->set_expr(shape->pod_type);
    t = b->add_label_selector();
    t->set_key(std::string(tpu::kLabelAcceleratorType));
    t->set_expr(tpu::AcceleratorTypeValue(*gen));
  }
  return rec;
}
}  // namespace

JobManager::JobManager(JobManagerConfig cfg) : cfg_(std::move(cfg)) {
  log_dir_ = cfg_.session_dir.empty()
                 ? (std::filesystem::temp_directory_path() / ("torus-jobs-" + RandomHex(4))).string()
                 : cfg_.session_dir + "/logs";
  std::error_code ec;
  std::filesystem::create_directories(log_dir_, ec);
}

JobManager::~JobManager() { Stop(); }

void JobManager::Stop() {
  std::vector<std::thread> threads;
  {
    MutexLock lock(mu_);
    if (stopping_.exchange(true)) return;
    for (auto& [id, j] : jobs_) {
      j.stop_requested = true;
      if (j.supervisor.joinable()) threads.push_back(std::move(j.supervisor));
    }
    cv_.NotifyAll();
  }
  for (auto& t : threads) t.join();
}

// ------------------------------------------------------------------------------- RPCs

grpc::Status JobManager::SubmitJob(grpc::ServerContext* ctx, const rpc::JobSubmitRequest* req,
                                   rpc::JobReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  if (req->entrypoint_size() == 0 || req->entrypoint(0).empty()) {
    SetError(reply->mutable_error(), InvalidArgument("a job needs a command (after --)"));
    return grpc::Status::OK;
  }
  if (req->max_retries() < 0) {
    SetError(reply->mutable_error(), InvalidArgument("--max-retries must be >= 0"));
    return grpc::Status::OK;
  }
  std::string id = "job_" + RandomHex(5);
  Job job;
  job.req = *req;
  if (!req->slice_topology().empty() || !req->accelerator_version().empty()) {
    if (req->slice_topology().empty() || req->accelerator_version().empty()) {
      SetError(reply->mutable_error(), InvalidArgument("--slice and --accelerator go together"));
      return grpc::Status::OK;
    }
    if (req->num_slices() < 0) {
      SetError(reply->mutable_error(), InvalidArgument("num_slices must be at least 1"));
      return grpc::Status::OK;
    }
    auto rec = SliceRecord(*req, id);
    if (!rec.ok()) {
      SetError(reply->mutable_error(), rec.status());
      return grpc::Status::OK;
    }
    job.slice_request = *rec;
  }
  auto& r = job.rec;
  r.set_job_id(id);
  r.set_state(rpc::JobRecord::PENDING);
  for (const auto& a : req->entrypoint()) r.add_entrypoint(a);
  r.set_working_dir(req->working_dir());
  r.set_max_retries(req->max_retries());
  r.set_exit_code(-1);
  r.set_submitted_ms(NowMs());
  r.set_slice_topology(req->slice_topology());
  r.set_accelerator_version(req->accelerator_version());
  r.set_num_slices(job.slice_request.has_slice() ? job.slice_request.slice().num_slices() : 0);
  job.log_path = log_dir_ + "/job-" + id + ".log";
  {
    std::ofstream create(job.log_path, std::ios::trunc);
  }
  MutexLock lock(mu_);
  if (stopping_) {
    SetError(reply->mutable_error(), Unavailable("the head is shutting down"));
    return grpc::Status::OK;
  }
  *reply->mutable_job() = r;
  TORUS_LOG(INFO) << "job " << id << " submitted: " << req->entrypoint(0)
                  << (req->slice_topology().empty() ? ""
                                                    : " on " + req->accelerator_version() + " " + req->slice_topology());
  TrimFinishedLocked();
  auto& stored = jobs_[id] = std::move(job);
  SaveLocked(id);
  stored.supervisor = std::thread([this, id] { Supervise(id); });
  return grpc::Status::OK;
}

grpc::Status JobManager::GetJob(grpc::ServerContext* ctx, const rpc::JobIdRequest* req,
                                rpc::JobReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  auto it = jobs_.find(req->job_id());
  if (it == jobs_.end()) {
    SetError(reply->mutable_error(), NotFound("no job '" + req->job_id() + "'"));
  } else {
    *reply->mutable_job() = it->second.rec;
  }
  return grpc::Status::OK;
}

grpc::Status JobManager::ListJobs(grpc::ServerContext* ctx, const rpc::Empty*, rpc::JobListReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  for (const auto& [id, j] : jobs_) *reply->add_jobs() = j.rec;
  std::sort(reply->mutable_jobs()->begin(), reply->mutable_jobs()->end(),
            [](const rpc::JobRecord& a, const rpc::JobRecord& b) { return a.submitted_ms() < b.submitted_ms(); });
  return grpc::Status::OK;
}

grpc::Status JobManager::StopJob(grpc::ServerContext* ctx, const rpc::JobIdRequest* req,
                                 rpc::JobReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  auto it = jobs_.find(req->job_id());
  if (it == jobs_.end()) {
    SetError(reply->mutable_error(), NotFound("no job '" + req->job_id() + "'"));
    return grpc::Status::OK;
  }
  it->second.stop_requested = true;
  cv_.NotifyAll();
  *reply->mutable_job() = it->second.rec;
  return grpc::Status::OK;
}

grpc::Status JobManager::JobLogs(grpc::ServerContext* ctx, const rpc::JobLogsRequest* req,
                                 grpc::ServerWriter<rpc::JobLogChunk>* writer) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::string path;
  {
    MutexLock lock(mu_);
    auto it = jobs_.find(req->job_id());
    if (it == jobs_.end()) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no job '" + req->job_id() + "'");
    path = it->second.log_path;
  }
  uint64_t offset = req->offset();
  std::vector<char> buf(64 * 1024);
  while (!ctx->IsCancelled()) {
    // The record is read before the file, so once it is terminal the file is complete.
    rpc::JobRecord rec;
    {
      MutexLock lock(mu_);
      rec = jobs_[req->job_id()].rec;
    }
    bool sent = false;
    std::ifstream f(path, std::ios::binary);
    if (f) {
      f.seekg(static_cast<std::streamoff>(offset));
      while (f) {
        f.read(buf.data(), static_cast<std::streamsize>(buf.size()));
        auto n = f.gcount();
        if (n <= 0) break;
        rpc::JobLogChunk c;
        c.set_offset(offset);
        c.set_data(buf.data(), static_cast<size_t>(n));
        if (!writer->Write(c)) return grpc::Status::OK;
        offset += static_cast<uint64_t>(n);
        sent = true;
      }
    }
    if (!req->follow() || IsTerminal(rec.state()) || stopping_) {
      rpc::JobLogChunk last;
      last.set_offset(offset);
      last.set_done(true);
      *last.mutable_job() = rec;
      writer->Write(last);
      return grpc::Status::OK;
    }
    if (!sent) {
      MutexLock lock(mu_);
      cv_.WaitFor(lock, std::chrono::milliseconds(50));
    }
  }
  return grpc::Status::OK;
}

// ------------------------------------------------------------------------------- supervision

void JobManager::AppendLog(const std::string& id, const std::string& text, int proc, uint64_t done) {
  if (text.empty() && proc < 0) return;
  std::string path;
  {
    MutexLock lock(mu_);
    path = jobs_[id].log_path;
  }
  {
    MutexLock lock(log_mu_);
    std::ofstream f(path, std::ios::binary | std::ios::app);
    f << text;
    f.flush();
    Progress& p = progress_[id];
    p.log_size = static_cast<uint64_t>(f.tellp());
    if (proc >= 0) {
      if (p.offsets.size() <= static_cast<size_t>(proc)) p.offsets.resize(proc + 1);
      p.offsets[proc] = done;
    }
  }
  MutexLock lock(mu_);
  cv_.NotifyAll();
}

bool JobManager::StopWanted(const std::string& id) {
  MutexLock lock(mu_);
  return stopping_ || jobs_[id].stop_requested;
}

void JobManager::SetMessage(const std::string& id, const std::string& message) {
  MutexLock lock(mu_);
  jobs_[id].rec.set_message(message);
  SaveLocked(id);
  cv_.NotifyAll();
}

void JobManager::Supervise(const std::string& id, bool resume) {
  while (true) {
    AttemptResult res = resume ? ResumeAttempt(id) : RunAttempt(id);
    resume = false;
    MutexLock lock(mu_);
    Job& j = jobs_[id];
    auto& r = j.rec;
    if (res.outcome == Outcome::kFailed && r.attempt() < r.max_retries() && !j.stop_requested &&
        !stopping_) {
      std::string note = "torus: attempt " + std::to_string(r.attempt() + 1) + " of job " + id +
                         " failed: " + res.message + "; retrying (" + std::to_string(r.attempt() + 1) +
                         " of " + std::to_string(r.max_retries()) + " retries)\n";
      TORUS_LOG(INFO) << note;
      r.set_attempt(r.attempt() + 1);
      r.set_state(rpc::JobRecord::PENDING);
      r.set_message("retrying after: " + res.message);
      SaveLocked(id);
      lock.Unlock();
      AppendLog(id, note);
      continue;
    }
    switch (res.outcome) {
      case Outcome::kSucceeded:
        r.set_state(rpc::JobRecord::SUCCEEDED);
        r.set_exit_code(0);
        r.clear_message();
        break;
      case Outcome::kStopped:
        r.set_state(rpc::JobRecord::STOPPED);
        r.set_message(res.message);
        break;
      case Outcome::kFailed:
        r.set_state(rpc::JobRecord::FAILED);
        r.set_message(res.message);
        r.set_exit_code(res.exit_code);
        break;
    }
    r.set_end_ms(NowMs());
    SaveLocked(id);
    TORUS_LOG(INFO) << "job " << id << " " << StateName(r.state())
                    << (r.message().empty() ? "" : ": " + r.message());
    cv_.NotifyAll();
    return;
  }
}

JobManager::AttemptResult JobManager::PickDriverNode(const std::string& id, std::vector<Target>* targets) {
  // The driver runs on the oldest alive node: the head's own node under `torus start --head`.
  auto head = rpc::Head::NewStub(GetChannel(head_address_));
  while (!StopWanted(id)) {
    rpc::ListReply list;
    auto ctx = NewContext(cfg_.token, 5000);
    auto st = head->List(ctx.get(), rpc::Empty(), &list);
    const rpc::NodeRecord* best = nullptr;
    if (st.ok()) {
      for (const auto& n : list.nodes()) {
        if (n.alive() && (!best || n.start_time_ms() < best->start_time_ms())) best = &n;
      }
    }
    if (best) {
      Target t;
      t.node_id = best->node_id();
      t.node_address = best->address();
      t.host = best->hostname();
      targets->push_back(t);
      return {Outcome::kSucceeded, "", -1};
    }
    SetMessage(id, "waiting for a node to run the driver on");
    MutexLock lock(mu_);
    cv_.WaitFor(lock, std::chrono::milliseconds(200));
  }
  return {Outcome::kStopped, "stopped before it started", -1};
}

void JobManager::RemoveReservation(const std::string& pg_id) {
  if (pg_id.empty()) return;
  auto head = rpc::Head::NewStub(GetChannel(head_address_));
  rpc::PlacementGroupRequest req;
  req.set_pg_id(pg_id);
  rpc::Empty e;
  auto ctx = NewContext(cfg_.token, 10000);
  auto st = head->RemovePlacementGroup(ctx.get(), req, &e);
  if (!st.ok()) TORUS_LOG(WARNING) << "cannot release reservation " << pg_id << ": " << st.error_message();
}

JobManager::AttemptResult JobManager::ReserveSlices(const std::string& id, std::string* pg_id,
                                                    std::vector<Target>* targets) {
  rpc::PlacementGroupRecord want;
  {
    MutexLock lock(mu_);
    want = jobs_[id].slice_request;
  }
  auto head = rpc::Head::NewStub(GetChannel(head_address_));
  {
    rpc::CreatePlacementGroupReply reply;
    auto ctx = NewContext(cfg_.token, 10000);
    auto st = head->CreatePlacementGroup(ctx.get(), want, &reply);
    if (!st.ok()) return {Outcome::kFailed, "cannot reserve the slices: " + st.error_message(), -1};
    if (reply.has_error() && reply.error().code() != 0) {
      return {Outcome::kFailed, "cannot reserve the slices: " + reply.error().message(), -1};
    }
    *pg_id = reply.pg_id();
  }
  {
    MutexLock lock(mu_);
    jobs_[id].rec.set_placement_group_id(*pg_id);
    SaveLocked(id);
  }
  rpc::PlacementGroupRecord pg;
  while (true) {
    if (StopWanted(id)) return {Outcome::kStopped, "stopped while waiting for the slices", -1};
    rpc::PlacementGroupRequest req;
    req.set_pg_id(*pg_id);
    req.set_wait_created_ms(200);
    rpc::GetPlacementGroupReply reply;
    auto ctx = NewContext(cfg_.token, 5000);
    auto st = head->GetPlacementGroup(ctx.get(), req, &reply);
    if (st.ok() && reply.found()) {
      pg = reply.pg();
      if (pg.state() == rpc::PlacementGroupRecord::CREATED) break;
      if (pg.state() == rpc::PlacementGroupRecord::REMOVED) {
        return {Outcome::kFailed, "the slice reservation ended: " + pg.pending_reason(), -1};
      }
      SetMessage(id, pg.pending_reason());
    }
  }
  // Hosts: slice name and worker id from the nodes' labels.
  std::map<std::string, std::string> host_of;
  {
    rpc::ListReply list;
    auto ctx = NewContext(cfg_.token, 5000);
    if (head->List(ctx.get(), rpc::Empty(), &list).ok()) {
      for (const auto& n : list.nodes()) {
        auto s = n.labels().find(std::string(tpu::kLabelSliceName));
        auto w = n.labels().find(std::string(tpu::kLabelWorkerId));
        host_of[n.node_id()] = (s == n.labels().end() ? n.node_id().substr(0, 8) : s->second) + "/" +
                               (w == n.labels().end() ? "?" : w->second);
      }
    }
  }
  int per = std::max(1, pg.slice().bundles_per_slice());
  for (const auto& b : pg.bundles()) {
    Target t;
    t.rank = b.index();
    t.slice_index = b.index() / per;
    t.node_id = b.node_id();
    t.node_address = b.node_address();
    t.host = host_of.count(b.node_id()) ? host_of[b.node_id()] : b.node_id().substr(0, 8);
    targets->push_back(t);
  }
  std::sort(targets->begin(), targets->end(), [](const Target& a, const Target& b) { return a.rank < b.rank; });
  {
    MutexLock lock(mu_);
    auto& r = jobs_[id].rec;
    r.clear_slice_names();
    for (const auto& s : pg.slice_names()) r.add_slice_names(s);
  }
  // Ranks are bundle indices in every epoch; the message carries the epoch.
  return {Outcome::kSucceeded, std::to_string(pg.epoch()), -1};
}

JobManager::AttemptResult JobManager::RunAttempt(const std::string& id) {
  Attempt a = BeginAttempt(id);
  AttemptResult r = a.gang ? ReserveSlices(id, &a.pg_id, &a.targets) : PickDriverNode(id, &a.targets);
  if (r.outcome != Outcome::kSucceeded) {
    RemoveReservation(a.pg_id);
    return r;
  }
  if (a.gang) a.epoch = std::atoi(r.message.c_str());
  if (auto failed = BuildEnvironments(a)) {
    RemoveReservation(a.pg_id);
    return *failed;
  }
  if (auto failed = StartProcesses(a)) {
    RemoveReservation(a.pg_id);
    return *failed;
  }
  MarkRunning(a);
  AttemptResult result = AwaitProcesses(a);
  RemoveReservation(a.pg_id);
  return result;
}

JobManager::Attempt JobManager::BeginAttempt(const std::string& id) {
  Attempt a;
  a.id = id;
  MutexLock lock(mu_);
  Job& j = jobs_[id];
  a.req = j.req;
  a.gang = j.slice_request.has_slice();
  j.rec.clear_processes();
  j.rec.clear_placement_group_id();
  j.rec.set_state(rpc::JobRecord::PENDING);
  {
    // The log as it stands (earlier attempts, notes) is what a resumed head keeps.
    std::error_code ec;
    auto size = std::filesystem::file_size(j.log_path, ec);
    MutexLock plock(log_mu_);
    progress_[id].offsets.clear();
    progress_[id].log_size = ec ? 0 : size;
  }
  SaveLocked(id);
  cv_.NotifyAll();
  return a;
}

std::optional<JobManager::AttemptResult> JobManager::BuildEnvironments(Attempt& a) {
  const int n = static_cast<int>(a.targets.size());
  // Environment of every process: the cluster's address (so ray::Init() joins it) and token.
  std::map<std::string, std::string> common = {{"TORUS_ADDRESS", head_address_},
                                                {"TORUS_TOKEN", cfg_.token},
                                                {"TORUS_SUBMISSION_ID", a.id}};
  a.env_set.assign(n, common);
  a.env_unset.assign(n, std::vector<std::string>{"RAY_ADDRESS"});
  if (!a.gang) return std::nullopt;
  auto gen = tpu::NormalizeVersion(a.req.accelerator_version());
  rpc::PickPortReply port;
  auto ctx = NewContext(cfg_.token, 5000);
  auto st = rpc::JobRunner::NewStub(GetChannel(a.targets[0].node_address))->PickPort(ctx.get(), rpc::Empty(), &port);
  if (!st.ok() || (port.has_error() && port.error().code() != 0)) {
    return AttemptResult{Outcome::kFailed,
                         "cannot pick a coordinator port on " + a.targets[0].host + ": " +
                             (st.ok() ? port.error().message() : st.error_message()),
                         -1};
  }
  std::string host = port.host() == "0.0.0.0" ? HostOf(a.targets[0].node_address) : port.host();
  for (int i = 0; i < n; ++i) {
    tpu::GangMember m;
    m.gen = gen.ok() ? *gen : tpu::Generation::kV6e;
    m.rank = a.targets[i].rank;
    m.num_processes = n;
    m.slice_index = a.targets[i].slice_index;
    m.num_slices = a.req.num_slices() > 0 ? a.req.num_slices() : 1;
    m.epoch = a.epoch;
    m.coordinator_address = host + ":" + std::to_string(port.port());
    m.megascale_host = host;
    auto c = tpu::GangEnv(m);
    for (const auto& k : c.unset) a.env_unset[i].push_back(k);
    for (const auto& [k, v] : c.set) a.env_set[i][k] = v;
    a.env_set[i]["TORUS_PLACEMENT_GROUP_ID"] = a.pg_id;
    a.env_set[i]["TORUS_BUNDLE_INDEX"] = std::to_string(a.targets[i].rank);
  }
  return std::nullopt;
}

std::optional<JobManager::AttemptResult> JobManager::StartProcesses(Attempt& a) {
  // Start every process at once; all start or none runs.
  const int n = static_cast<int>(a.targets.size());
  a.started.assign(n, rpc::JobProcessStartReply());
  {
    // The intent, saved first: a head resumed after dying meanwhile stops what these calls
    // started before it starts the attempt again.
    MutexLock lock(mu_);
    auto& r = jobs_[a.id].rec;
    r.clear_processes();
    for (const auto& t : a.targets) {
      auto* p = r.add_processes();
      p->set_rank(t.rank);
      p->set_node_id(t.node_id);
      p->set_node_address(t.node_address);
      p->set_host(t.host);
      p->set_state(rpc::JobProcessInfo::STARTING);
    }
    SaveLocked(a.id);
  }
  std::vector<std::string> start_error(n);
  {
    std::vector<std::thread> ts;
    for (int i = 0; i < n; ++i) {
      ts.emplace_back([&, i] {
        rpc::JobProcessSpec spec;
        spec.set_job_id(a.id);
        spec.set_rank(a.targets[i].rank);
        for (const auto& arg : a.req.entrypoint()) spec.add_argv(arg);
        for (const auto& [k, v] : a.env_set[i]) (*spec.mutable_env_set())[k] = v;
        for (const auto& k : a.env_unset[i]) spec.add_env_unset(k);
        spec.set_cwd(a.req.working_dir());
        spec.set_whole_host_tpu(a.gang);
        auto ctx = NewContext(cfg_.token, 10000);
        auto st = rpc::JobRunner::NewStub(GetChannel(a.targets[i].node_address))
                      ->StartProcess(ctx.get(), spec, &a.started[i]);
        if (!st.ok()) start_error[i] = st.error_message();
        else if (a.started[i].has_error() && a.started[i].error().code() != 0) start_error[i] = a.started[i].error().message();
      });
    }
    for (auto& t : ts) t.join();
  }
  for (int i = 0; i < n; ++i) {
    if (start_error[i].empty()) continue;
    for (int k = 0; k < n; ++k) {
      if (start_error[k].empty()) StopProcess(a, k);
    }
    return AttemptResult{Outcome::kFailed,
                         "process " + std::to_string(a.targets[i].rank) + " could not start on " +
                             a.targets[i].host + ": " + start_error[i],
                         -1};
  }
  return std::nullopt;
}

void JobManager::StopProcess(const Attempt& a, int i) {
  if (a.started[i].process_id().empty()) return;
  rpc::JobProcessRef ref;
  ref.set_process_id(a.started[i].process_id());
  rpc::Empty e;
  auto ctx = NewContext(cfg_.token, 5000);
  (void)rpc::JobRunner::NewStub(GetChannel(a.targets[i].node_address))->StopProcess(ctx.get(), ref, &e);
}

void JobManager::MarkRunning(const Attempt& a) {
  MutexLock lock(mu_);
  auto& r = jobs_[a.id].rec;
  r.clear_processes();  // the STARTING intents
  for (size_t i = 0; i < a.targets.size(); ++i) {
    auto* p = r.add_processes();
    p->set_rank(a.targets[i].rank);
    p->set_node_id(a.targets[i].node_id);
    p->set_node_address(a.targets[i].node_address);
    p->set_host(a.targets[i].host);
    p->set_pid(a.started[i].pid());
    p->set_state(rpc::JobProcessInfo::RUNNING);
    p->set_started_ms(a.started[i].started_ms());
    p->set_process_id(a.started[i].process_id());
  }
  r.set_state(rpc::JobRecord::RUNNING);
  r.clear_message();
  SaveLocked(a.id);
  cv_.NotifyAll();
}

JobManager::ProcessEnd JobManager::TailProcess(const Attempt& a, int i) {
  std::string prefix = a.gang ? "[" + a.targets[i].host + "] " : "";
  std::string partial;
  uint64_t offset = i < static_cast<int>(a.start_offsets.size()) ? a.start_offsets[i] : 0;
  int failures = 0;
  ProcessEnd ev{i, false, "", -1};
  auto saved = Clock::now();
  auto emit = [&](const std::string& data, bool flush) {
    uint64_t end = offset + data.size();  // the output copied once `data` is
    if (!a.gang) {
      AppendLog(a.id, data, i, end);
    } else {
      partial += data;
      std::string out;
      size_t pos;
      while ((pos = partial.find('\n')) != std::string::npos) {
        out += prefix + partial.substr(0, pos + 1);
        partial.erase(0, pos + 1);
      }
      if (flush && !partial.empty()) {
        out += prefix + partial + "\n";
        partial.clear();
      }
      AppendLog(a.id, out, i, end - partial.size());  // an unfinished line is copied again
    }
    if (Clock::now() - saved >= std::chrono::milliseconds(500)) {
      saved = Clock::now();
      Save(a.id);
    }
  };
  auto stub = rpc::JobRunner::NewStub(GetChannel(a.targets[i].node_address));
  while (true) {
    rpc::JobProcessTailRequest treq;
    treq.set_process_id(a.started[i].process_id());
    treq.set_offset(offset);
    auto ctx = NewContext(cfg_.token);
    auto reader = stub->TailProcess(ctx.get(), treq);
    rpc::JobProcessOutput out;
    bool exited = false;
    while (reader->Read(&out)) {
      if (!out.data().empty() && out.offset() == offset) {
        emit(out.data(), false);
        offset += out.data().size();
        failures = 0;
      }
      if (out.exited()) {
        exited = true;
        ev.ok = out.exit_code() == 0;
        ev.description = out.description();
        ev.exit_code = out.exit_code();
      }
    }
    auto st = reader->Finish();
    if (exited) break;
    if (++failures > 10 || (stopping_ && failures > 2)) {
      ev.description = "lost contact with its node " + a.targets[i].node_id + " (" + st.error_message() + ")";
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  emit("", true);
  return ev;
}

JobManager::AttemptResult JobManager::AwaitProcesses(const Attempt& a) {
  // Tail every process; each tail ends with one event: how its process ended.
  const int n = static_cast<int>(a.targets.size());
  std::mutex ev_mu;
  std::condition_variable ev_cv;
  std::deque<ProcessEnd> events;
  std::vector<std::thread> tails;
  for (int i = 0; i < n; ++i) {
    tails.emplace_back([&, i] {
      ProcessEnd ev = TailProcess(a, i);
      std::lock_guard<std::mutex> lock(ev_mu);
      events.push_back(std::move(ev));
      ev_cv.notify_all();
    });
  }
  int remaining = n;
  bool stopping = false;
  AttemptResult failure;
  bool failed = false;
  std::vector<bool> exited(n, false);
  auto stop_others = [&] {
    for (int k = 0; k < n; ++k) {
      if (!exited[k]) StopProcess(a, k);
    }
  };
  while (remaining > 0) {
    std::deque<ProcessEnd> got;
    {
      std::unique_lock<std::mutex> lock(ev_mu);
      ev_cv.wait_for(lock, std::chrono::milliseconds(100), [&] { return !events.empty(); });
      got.swap(events);
    }
    if (!stopping && StopWanted(a.id)) {
      stopping = true;
      stop_others();
    }
    for (const auto& ev : got) {
      --remaining;
      exited[ev.index] = true;
      NoteProcessExited(a.id, ev);
      if (!ev.ok && !failed && !stopping) {
        failed = true;
        failure = FailureOf(a, ev);
        // The first failure ends the attempt: the others are stopped (spec: a gang never runs
        // partially).
        stop_others();
      }
    }
  }
  for (auto& t : tails) t.join();
  if (stopping && !failed) return {Outcome::kStopped, "stopped by request", -1};
  if (failed) return failure;
  return {Outcome::kSucceeded, "", 0};
}

void JobManager::NoteProcessExited(const std::string& id, const ProcessEnd& ev) {
  MutexLock lock(mu_);
  auto* p = jobs_[id].rec.mutable_processes(ev.index);
  p->set_state(rpc::JobProcessInfo::EXITED);
  p->set_exit_description(ev.description);
  SaveLocked(id);
  cv_.NotifyAll();
}

JobManager::AttemptResult JobManager::FailureOf(const Attempt& a, const ProcessEnd& ev) {
  AttemptResult failure;
  failure.outcome = Outcome::kFailed;
  failure.exit_code = ev.exit_code;
  failure.message = a.gang ? "process " + std::to_string(a.targets[ev.index].rank) + " on host " +
                                 a.targets[ev.index].host + " " + ev.description
                           : "the driver " + ev.description;
  return failure;
}

}  // namespace torus
