#include "head/jobs.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>

#include "common/wall_clock.h"
#include "common/ids.h"
#include "common/labels.h"
#include "common/logging.h"
#include "common/resources.h"
#include "common/rpc.h"
#include "common/wire_states.h"
#include "tpu/gang_env.h"
#include "tpu/topology.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;




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
    r.set_end_ms(WallClockMs());
    SaveLocked(id);
    TORUS_LOG(INFO) << "job " << id << " " << StateName(r.state())
                    << (r.message().empty() ? "" : ": " + r.message());
    cv_.NotifyAll();
    return;
  }
}

JobManager::AttemptResult JobManager::PickDriverNode(const std::string& id, std::vector<Target>* targets) {
  // The driver runs on the oldest alive node that has the resources and labels asked for (not
  // reserved: the node's total counts): the head's own node under `torus start --head`.
  rpc::JobSubmitRequest req;
  {
    MutexLock lock(mu_);
    req = jobs_[id].req;
  }
  auto selector = ParseLabelSelector({req.driver_label_selector().begin(), req.driver_label_selector().end()});
  if (!selector.ok()) return {Outcome::kFailed, selector.status().message(), -1};
  auto fits = [&](const rpc::NodeRecord& n) {
    return Fits(FromProto(req.driver_resources()), FromProto(n.total())) && MatchesLabels(*selector, n.labels());
  };
  auto head = rpc::Head::NewStub(GetChannel(head_address_));
  while (!StopWanted(id)) {
    rpc::ListReply list;
    auto ctx = NewContext(cfg_.token, 5000);
    auto st = head->List(ctx.get(), rpc::Empty(), &list);
    const rpc::NodeRecord* best = nullptr;
    if (st.ok()) {
      for (const auto& n : list.nodes()) {
        if (n.alive() && fits(n) && (!best || n.start_time_ms() < best->start_time_ms())) best = &n;
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
    SetMessage(id, FromProto(req.driver_resources()).empty() && req.driver_label_selector().empty()
                       ? "waiting for a node to run the driver on"
                       : "waiting for a node with the driver's resources and labels");
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
  // The reservation's id is saved with the job before the reservation is made: a head that dies
  // in between resumes the job knowing what to release (a reservation made but not recorded
  // would hold its slices for good).
  *pg_id = NewPgId();
  {
    MutexLock lock(mu_);
    want = jobs_[id].slice_request;
    jobs_[id].rec.set_placement_group_id(*pg_id);
    SaveLocked(id);
  }
  want.set_pg_id(*pg_id);
  auto head = rpc::Head::NewStub(GetChannel(head_address_));
  {
    rpc::CreatePlacementGroupReply reply;
    auto ctx = NewContext(cfg_.token, 10000);
    auto st = head->CreatePlacementGroup(ctx.get(), want, &reply);
    if (!st.ok()) return {Outcome::kFailed, "cannot reserve the slices: " + st.error_message(), -1};
    if (reply.has_error() && reply.error().code() != 0) {
      return {Outcome::kFailed, "cannot reserve the slices: " + reply.error().message(), -1};
    }
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
  // The request's env_vars (Ray's runtime_env) first, so the cluster's own cannot be overridden.
  std::map<std::string, std::string> common(a.req.env_vars().begin(), a.req.env_vars().end());
  common["TORUS_ADDRESS"] = head_address_;
  common["TORUS_TOKEN"] = cfg_.token;
  common["TORUS_SUBMISSION_ID"] = a.id;
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
  if (r.start_ms() == 0) r.set_start_ms(WallClockMs());
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
