// CoreWorker's lifecycle (connect, shutdown, the worker loop), its tracked helper threads, the
// Runtime calls it forwards to the HeadClient, and the worker side: the PushTasks service and
// TaskExecutor::Host. The other parts of CoreWorker are core_worker_{objects,borrows,tasks,actors}.cc.

#include "core/core_worker.h"

#include "common/head_addresses.h"

#include <cxxabi.h>
#include <poll.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <nlohmann/json.hpp>

#include "common/wall_clock.h"
#include "common/env_key.h"
#include "common/ids.h"
#include "common/json_limits.h"
#include "common/labels.h"
#include "common/lane.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/session.h"
#include "common/thread_annotations.h"
#include "common/wire_states.h"
#include "common/work_queue.h"
#include "core/conn.h"
#include "core/log_forwarder.h"
#include "core/task_record.h"
#include "tpu/chip_visibility.h"
#include "torus/api/exceptions.h"
#include "torus/api/runtime_env.h"
#include "torus/api/serializer.h"

namespace torus::core {

namespace {
using Clock = std::chrono::steady_clock;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now().time_since_epoch())
      .count();
}
}  // namespace

// ------------------------------------------------------------------------------- lifecycle

CoreWorker::CoreWorker(CoreWorkerOptions opts)
    : opts_(std::move(opts)),
      refs_(ReferenceCounter::Hooks{
          [this](ReferenceCounter::FreeRequest r) { FreeInStore(std::move(r)); },
          [this] { borrow_cv_.notify_all(); }}),
      rpc_work_(std::make_unique<WorkQueue>(4, 4096)) {}

std::vector<std::string> PythonWorkerCommand(const std::vector<std::string>& given) {
  if (!given.empty()) return given;
  if (const char* env = std::getenv("TORUS_PYTHON_WORKER_COMMAND"); env && *env) {
    auto parsed = ParseJson(env, "TORUS_PYTHON_WORKER_COMMAND");
    const nlohmann::json j = parsed.ok() ? std::move(*parsed) : nlohmann::json();
    if (j.is_array() && !j.empty()) {
      std::vector<std::string> out;
      for (const auto& a : j) {
        if (a.is_string()) out.push_back(a.get<std::string>());
      }
      if (out.size() == j.size()) return out;
    }
    std::fprintf(stderr,
                 "torus: ignoring TORUS_PYTHON_WORKER_COMMAND: not a JSON list of strings\n");
  }
  return {"python3", "-m", "torus._private.worker_main"};
}

StatusOr<std::unique_ptr<CoreWorker>> CoreWorker::Create(CoreWorkerOptions opts) {
  if (auto s = ValidateToken(opts.token, "the worker's options"); !s.ok()) return s;
  if (opts.worker_id.empty()) opts.worker_id = RandomHex(14);
  std::unique_ptr<CoreWorker> cw(new CoreWorker(std::move(opts)));
  if (auto s = cw->Connect(); !s.ok()) return s;
  return cw;
}

void CoreWorker::SetUpExecution() {
  python_command_ = PythonWorkerCommand(opts_.python_worker_command);
  python_runtime_key_ = CommandKey(python_command_);
  if (!opts_.is_driver) {
    std::unique_ptr<Executor> executor;
    if (opts_.make_executor) executor = opts_.make_executor();
    if (!executor) executor = std::make_unique<CppExecutor>(executable_);
    task_executor_ = std::make_unique<TaskExecutor>(static_cast<TaskExecutor::Host*>(this),
                                                    std::move(executor));
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);  // before any thread can write to it
  }
}

Status CoreWorker::Connect() {
  executable_ = SelfExecutable();
  if (opts_.code_search_path.empty()) {
    runtime_key_ = "exe:" + executable_;
  } else {
    runtime_key_ = "code:";
    for (const auto& p : opts_.code_search_path) runtime_key_ += ":" + p;
  }
  SetUpExecution();
  int port = 0;
  std::vector<grpc::Service*> services = {this};
  if (task_executor_) {
    // Workers take their tasks over the lane too (drivers run none).
    lane_ = std::make_unique<LaneServer>(opts_.token, "worker " + opts_.worker_id);
    lane_->HandleStream(kPushTasksMethod, [this](LaneServerStream* s) {
      LaneTaskServerStream adapter{s};
      return task_executor_->ServeTasks(&adapter);
    });
    if (lane_->Start(opts_.bind_host) > 0) {
      services.push_back(lane_.get());
    } else {
      lane_.reset();
    }
  }
  server_ = StartServer(opts_.bind_host, &port, services);
  if (server_ && lane_) lane_->SetGrpcPort(port);
  if (!server_ || port == 0) return Unavailable("cannot start the core worker's RPC server");
  address_ = opts_.bind_host + ":" + std::to_string(port);
  RegisterInProcessServer(address_, server_.get(), this);
  node_ = rpc::Node::NewStub(GetChannel(opts_.node_address));
  rpc::RegisterWorkerRequest req;
  req.set_worker_id(opts_.worker_id);
  req.set_address(address_);
  req.set_pid(getpid());
  req.set_is_driver(opts_.is_driver);
  if (opts_.is_driver && opts_.warm_workers > 0 && !opts_.python_worker_command.empty()) {
    req.set_job_id(opts_.job_id);
    for (const auto& a : python_command_) req.add_warm_command(a);
    for (const auto& [k, v] : opts_.job_env_vars) (*req.mutable_warm_env_vars())[k] = v;
    req.set_warm_workers(opts_.warm_workers);
  }
  rpc::RegisterWorkerReply reply;
  auto ctx = NewContext(opts_.token, 10000);
  auto st = node_->RegisterWorker(ctx.get(), req, &reply);
  if (!st.ok()) return FromGrpc(st, "cannot register with the node at " + opts_.node_address);
  node_id_ = reply.node_id();
  refs_.SetIdentity(address_, node_id_, opts_.node_address);
  shm_prefix_ = reply.shm_prefix();
  auto arena = OpenSegment(reply.arena_name(), /*writable=*/true);
  if (!arena.ok()) return arena.status();
  arena_ = std::shared_ptr<Mapping>(std::move(*arena));
  session_dir_ = reply.session_dir();
  // The address given first, then every head the node knows (a head on etcd and its standbys).
  opts_.head_address = HeadAddresses(opts_.head_address + "," + reply.head_address()).joined();
  head_ = std::make_unique<HeadClient>(opts_.head_address, opts_.token, [this] {
    std::vector<std::string> heads;
    rpc::HeadAddressesReply reply;
    auto ctx = NewContext(opts_.token, 1000);
    if (node_->HeadAddresses(ctx.get(), rpc::Empty(), &reply).ok()) heads.assign(reply.addresses().begin(), reply.addresses().end());
    return heads;
  });
  if (opts_.is_driver) {
    rpc::JobRequest job;
    job.set_job_id(opts_.job_id);
    job.set_driver_address(address_);
    job.set_pid(getpid());
    job.set_ray_namespace(opts_.ray_namespace);
    if (auto st = head_->RegisterJob(job); !st.ok()) return st;
  }
  housekeeping_thread_ = std::thread([this] { HousekeepingLoop(); });
  borrow_thread_ = std::thread([this] { BorrowLoop(); });
  if (opts_.on_ready) opts_.on_ready(this);
  {
    std::lock_guard<std::mutex> lock(ready_mu_);
    ready_ = true;
  }
  ready_cv_.notify_all();
  return Status::Ok();
}

CoreWorker::~CoreWorker() {
  Shutdown();
  // Destroying the server joins its RPC threads, so no handler (BorrowObjects, GetObject) still
  // touches the object table that the member destructors below tear down.
  server_.reset();
  if (wake_fd_ >= 0) close(wake_fd_);
}

void CoreWorker::Shutdown() {
  if (shutting_down_.exchange(true)) return;
  if (opts_.is_driver && head_) {
    int64_t finished = 0, failed = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished = tasks_finished_;
      failed = tasks_failed_;
    }
    head_->FinishJob(opts_.job_id, finished, failed);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    borrow_cv_.notify_all();
  }
  if (borrow_thread_.joinable()) borrow_thread_.join();
  ReleaseAllBorrows(2000);
  std::vector<std::shared_ptr<Conn>> conns;
  std::vector<std::string> free_names;
  std::vector<std::pair<std::string, std::string>> leases;  // (node address, lease id)
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : conns_) {
      if (!c->lease_id.empty() && !c->returned) leases.emplace_back(c->node_address, c->lease_id);
      c->Cancel();
      conns.push_back(std::move(c));
    }
    conns_.clear();
    for (auto& d : dead_conns_) conns.push_back(std::move(d));
    dead_conns_.clear();
    free_names = refs_.Clear();
    cv_.notify_all();
  }
  for (auto& c : conns) c->Join();
  for (const auto& [addr, lease] : leases) {
    rpc::ReturnLeaseRequest req;
    req.set_lease_id(lease);
    rpc::Empty e;
    auto ctx = NewContext(opts_.token, 2000);
    (void)NodeStub(addr)->ReturnLease(ctx.get(), req, &e);
  }
  if (!free_names.empty()) {
    rpc::FreeObjectsRequest req;
    for (auto& n : free_names) req.add_keys(n);
    rpc::Empty e;
    auto ctx = NewContext(opts_.token, 2000);
    (void)node_->FreeObjects(ctx.get(), req, &e);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    hk_cv_.notify_all();
  }
  if (housekeeping_thread_.joinable()) housekeeping_thread_.join();
  // End helper threads: cancel their blocking RPCs, then wait for them.
  std::list<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> tracked;
  {
    std::lock_guard<std::mutex> lock(track_mu_);
    for (auto* c : live_ctx_) c->TryCancel();
    tracked.swap(tracked_);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  for (auto& [t, done] : tracked) t.join();
  rpc_work_->Stop();  // runs the frees and lease returns still queued
  if (log_forwarder_) log_forwarder_->Stop();
  UnregisterInProcessServer(address_);
  // A stream still running a task keeps its lane thread: then the lane outlives us (leaked on
  // purpose; the process is ending).
  if (lane_ && !lane_->Stop(std::chrono::milliseconds(200))) (void)lane_.release();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
}

namespace {
std::atomic<bool>* g_term_flag = nullptr;
std::atomic<int> g_wake_fd{-1};
void OnSigterm(int) {
  if (g_term_flag) *g_term_flag = true;
  int fd = g_wake_fd.load();
  uint64_t one = 1;
  if (fd >= 0) (void)!write(fd, &one, sizeof one);  // async-signal-safe
}
}  // namespace

void CoreWorker::WakeWorkerLoop() {
  uint64_t one = 1;
  if (wake_fd_ >= 0) (void)!write(wake_fd_, &one, sizeof one);
}

void CoreWorker::ExitSoon(std::chrono::milliseconds grace) {
  exit_at_ms_ = NowMs() + grace.count();
  WakeWorkerLoop();
}

bool CoreWorker::NodeGone(std::chrono::milliseconds wait) {
  if (opts_.is_driver) return false;
  if (getppid() != node_pid_) return true;
  if (wait.count() <= 0) return false;
  // Its sockets close a moment before the kernel reparents us: wait for the end on a pidfd.
  int fd = static_cast<int>(syscall(SYS_pidfd_open, node_pid_, 0));
  if (fd < 0) return errno == ESRCH;
  pollfd p{fd, POLLIN, 0};
  const bool ended = poll(&p, 1, static_cast<int>(wait.count())) > 0;
  close(fd);
  return ended || getppid() != node_pid_;
}

void CoreWorker::RunWorkerLoop() {
  pid_t parent = getppid();
  // The node's end wakes us through a pidfd (a node that dies without stopping its workers).
  int parent_fd = static_cast<int>(syscall(SYS_pidfd_open, parent, 0));
  // A SIGTERM (the node stopping surplus idle workers) is honoured once this worker owns
  // nothing that another process still refers to: the objects it owns die with it. An actor
  // worker, or a node that is stopping (it SIGKILLs after a grace period), ends it anyway.
  g_term_flag = &term_requested_;
  g_wake_fd = wake_fd_;
  struct sigaction sa{};
  sa.sa_handler = OnSigterm;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  bool told_deferral = false;
  while (!exit_requested_) {
    // No pidfd (old kernel) or no eventfd (out of descriptors): look every second.
    int timeout_ms = parent_fd >= 0 && wake_fd_ >= 0 ? -1 : 1000;
    if (term_requested_) timeout_ms = 100;  // deferred: look again as the owned objects go
    if (int64_t at = exit_at_ms_; at != 0) {
      timeout_ms = static_cast<int>(std::clamp<int64_t>(at - NowMs(), 0, 1000));
    }
    pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {parent_fd, POLLIN, 0}};
    (void)poll(fds, parent_fd >= 0 ? 2 : 1, timeout_ms);
    uint64_t drained;
    if (fds[0].revents & POLLIN) (void)!read(wake_fd_, &drained, sizeof drained);
    if (int64_t at = exit_at_ms_; at != 0 && NowMs() >= at) {  // ExitActor()
      fflush(stdout);
      fflush(stderr);
      _exit(0);
    }
    if ((parent_fd >= 0 && (fds[1].revents & (POLLIN | POLLHUP))) || getppid() != parent) {
      TORUS_LOG(WARNING) << "node process went away; worker exiting";
      break;
    }
    if (term_requested_) {
      bool owns;
      {
        std::lock_guard<std::mutex> lock(mu_);
        owns = task_executor_->actor_id().empty() && refs_.OwnsLiveObjects();
      }
      if (!owns) {
        ReleaseAllBorrows(1000);
        signal(SIGTERM, SIG_DFL);
        raise(SIGTERM);
      }
      if (!told_deferral) {
        TORUS_LOG(INFO) << "SIGTERM received; exiting once the objects this worker owns are released";
        told_deferral = true;
      }
    }
  }
  ReleaseAllBorrows(1000);
  fflush(stdout);
  fflush(stderr);
  std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let forwarded output go out
  _exit(0);
}

void CoreWorker::SpawnTracked(std::function<void()> fn) {
  std::lock_guard<std::mutex> lock(track_mu_);
  if (shutting_down_) return;
  for (auto it = tracked_.begin(); it != tracked_.end();) {
    if (*it->second) {
      it->first.join();
      it = tracked_.erase(it);
    } else {
      ++it;
    }
  }
  auto done = std::make_shared<std::atomic<bool>>(false);
  tracked_.emplace_back(std::thread([fn = std::move(fn), done] {
                          fn();
                          *done = true;
                        }),
                        done);
}

std::unique_ptr<grpc::ClientContext> CoreWorker::TrackedContext(int64_t deadline_ms) {
  auto ctx = NewContext(opts_.token, deadline_ms);
  std::lock_guard<std::mutex> lock(track_mu_);
  if (shutting_down_) ctx->TryCancel();
  live_ctx_.insert(ctx.get());
  return ctx;
}

void CoreWorker::ReleaseContext(grpc::ClientContext* ctx) {
  std::lock_guard<std::mutex> lock(track_mu_);
  live_ctx_.erase(ctx);
}

std::unique_ptr<rpc::Node::Stub> CoreWorker::NodeStub(const std::string& address) {
  return rpc::Node::NewStub(GetChannel(address));
}

// ------------------------------------------------------------------------------- execution


void CoreWorker::SetTaskState(const rpc::TaskSpec& spec, rpc::TaskInfo::State state, Conn* conn,
                              const std::string& error, const rpc::TaskResult* result) {
  uint64_t key = TaskCounterOf(spec.task_id());
  auto [it, fresh] = task_table_.try_emplace(key);
  TaskEntry& info = it->second;
  if (fresh) {
    info.name = spec.name().empty() ? spec.function() : spec.name();
    info.actor_id = spec.actor_id();
    info.job_id = spec.job_id();
    info.submitted_ms = WallClockMs();
  }
  auto ended = [](rpc::TaskInfo::State s) { return s == rpc::TaskInfo::FINISHED || s == rpc::TaskInfo::FAILED; };
  bool was_ended = !fresh && ended(info.state);
  if (!fresh) --tasks_in_state_[info.state];
  ++tasks_in_state_[state];
  info.state = state;
  info.attempt = spec.attempt();
  if (!error.empty()) info.error = error;
  // Times: RUNNING starts a span on the worker it was sent to; waiting again (a retry, a lease
  // taken back) clears it; the end takes the executor's own times when it sent them.
  if (state == rpc::TaskInfo::RUNNING) {
    if (conn) {
      info.place = conn->place();
    }
    info.start_us = WallClockUs();
    info.end_us = 0;
  } else if (state == rpc::TaskInfo::PENDING || state == rpc::TaskInfo::PENDING_ARGS) {
    info.start_us = info.end_us = 0;
  } else if (ended(state) && !was_ended) {
    if (result && result->start_us() > 0) {
      info.start_us = result->start_us();
      info.end_us = result->start_us() + static_cast<int64_t>(result->exec_us());
    } else if (info.start_us > 0) {
      info.end_us = WallClockUs();  // it was sent but no executor times came back
    }
  }
  if (ended(state) && !was_ended) {
    ++(state == rpc::TaskInfo::FINISHED ? tasks_finished_ : tasks_failed_);
    finished_tasks_.push_back(key);
    while (finished_tasks_.size() > 10000) {
      if (auto old = task_table_.find(finished_tasks_.front()); old != task_table_.end()) {
        --tasks_in_state_[old->second.state];
        task_table_.erase(old);
      }
      finished_tasks_.pop_front();
    }
  }
}

grpc::Status CoreWorker::TaskCounts(grpc::ServerContext* ctx, const rpc::Empty*, rpc::TaskCountsReply* out) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  for (auto st : {rpc::TaskInfo::PENDING_ARGS, rpc::TaskInfo::PENDING, rpc::TaskInfo::RUNNING}) {
    (*out->mutable_current())[StateName(st)] = tasks_in_state_[st];
  }
  (*out->mutable_ended())[StateName(rpc::TaskInfo::FINISHED)] = tasks_finished_;
  (*out->mutable_ended())[StateName(rpc::TaskInfo::FAILED)] = tasks_failed_;
  return grpc::Status::OK;
}

grpc::Status CoreWorker::ListTasks(grpc::ServerContext* ctx, const rpc::Empty*, rpc::TaskList* out) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  std::string prefix = opts_.worker_id.substr(0, 16);
  for (const auto& [key, e] : task_table_) {
    rpc::TaskInfo* info = out->add_tasks();
    info->set_task_id(prefix + Hex64(key));
    info->set_name(e.name);
    info->set_state(e.state);
    if (e.place) info->set_worker_id(e.place->worker_id);
    info->set_attempt(e.attempt);
    info->set_error(e.error);
    info->set_actor_id(e.actor_id);
    info->set_job_id(e.job_id);
    if (e.place) info->set_node_id(e.place->node_id);
    info->set_start_us(e.start_us);
    info->set_end_us(e.end_us);
    info->set_submitted_ms(e.submitted_ms);
  }
  return grpc::Status::OK;
}

std::string CoreWorker::JobId() {
  if (opts_.is_driver) return opts_.job_id;
  std::lock_guard<std::mutex> lock(log_mu_);
  return current_job_;
}

std::string CoreWorker::GetNamespace() {
  if (opts_.is_driver) return opts_.ray_namespace;
  std::lock_guard<std::mutex> lock(log_mu_);
  return current_namespace_;
}

bool CoreWorker::DefaultDetached() {
  if (opts_.is_driver) return opts_.default_detached;
  std::lock_guard<std::mutex> lock(log_mu_);
  return current_default_detached_;
}

std::string CoreWorker::DriverAddress() {
  if (opts_.is_driver) return address_;
  std::lock_guard<std::mutex> lock(log_mu_);
  return current_driver_;
}

void CoreWorker::SetJobConfig(const std::string& serialized_runtime_env, rpc::TaskSpec* spec,
                              bool with_env) {
  auto own = internal::EnvVarsOfSerialized(serialized_runtime_env);
  std::unique_lock<std::mutex> lock(log_mu_, std::defer_lock);
  if (!opts_.is_driver) lock.lock();
  spec->set_default_detached(opts_.is_driver ? opts_.default_detached : current_default_detached_);
  if (!with_env) return;
  auto& env = *spec->mutable_env_vars();
  for (const auto& [k, v] : opts_.is_driver ? opts_.job_env_vars : current_env_vars_) env[k] = v;
  for (const auto& [k, v] : own) env[k] = v;
}

grpc::Status CoreWorker::PrintLogs(grpc::ServerContext* ctx, const rpc::LogBatch* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  std::string prefix = "(worker " + req->worker_id().substr(0, 8) + " pid=" +
                       std::to_string(req->pid()) + " node=" + req->node_id().substr(0, 8) + ") ";
  std::string out, err;
  for (const auto& l : req->stdout_lines()) out += prefix + l + "\n";
  for (const auto& l : req->stderr_lines()) err += prefix + l + "\n";
  if (!out.empty()) (void)!write(STDOUT_FILENO, out.data(), out.size());
  if (!err.empty()) (void)!write(STDERR_FILENO, err.data(), err.size());
  return grpc::Status::OK;
}

void CoreWorker::CaptureOutput() {
  log_forwarder_ = std::make_unique<LogForwarder>(
      LogForwarder::Identity{opts_.worker_id, node_id_, opts_.token}, [this] { return DriverAddress(); });
  if (!log_forwarder_->Start()) TORUS_LOG(WARNING) << "cannot capture the worker's output";
}

grpc::Status CoreWorker::Exit(grpc::ServerContext* ctx, const rpc::Empty*, rpc::Empty*) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  exit_requested_ = true;
  WakeWorkerLoop();
  return grpc::Status::OK;
}

grpc::Status CoreWorker::CheckLease(grpc::ServerContext* ctx, const rpc::CheckLeaseRequest* req,
                                    rpc::CheckLeaseReply* reply) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  if (!task_executor_) {  // a driver: no stream names any lease
    reply->set_use(rpc::CheckLeaseReply::REVOKED);
    return grpc::Status::OK;
  }
  switch (task_executor_->lease_use().Check(req->lease_id())) {
    case LeaseUse::Use::kInUse: reply->set_use(rpc::CheckLeaseReply::IN_USE); break;
    case LeaseUse::Use::kRevoked: reply->set_use(rpc::CheckLeaseReply::REVOKED); break;
    case LeaseUse::Use::kUndecided: reply->set_use(rpc::CheckLeaseReply::UNDECIDED); break;
  }
  return grpc::Status::OK;
}

grpc::Status CoreWorker::PushTasks(grpc::ServerContext* ctx,
                                   grpc::ServerReaderWriter<rpc::ResultBatch, rpc::TaskBatch>* stream) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  if (!task_executor_) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "a driver does not run tasks");
  }
  return task_executor_->ServeTasks(stream);
}

// ------------------------------------------------------------------------------- TaskExecutor::Host

void CoreWorker::WaitReady() {
  std::unique_lock<std::mutex> lock(ready_mu_);
  ready_cv_.wait(lock, [this] { return ready_; });
}

void CoreWorker::EnterTask(const rpc::TaskSpec& spec) {
  std::lock_guard<std::mutex> lock(log_mu_);
  current_driver_ = spec.driver_address();
  current_job_ = spec.job_id();
  current_namespace_ = spec.ray_namespace();
  current_default_detached_ = spec.default_detached();
  if (spec.actor_creation() || spec.actor_id().empty()) {
    current_env_vars_ = {spec.env_vars().begin(), spec.env_vars().end()};
  }
}

std::shared_ptr<internal::Buffer> CoreWorker::GetOne(const std::string& id) { return GetOne(id, -1); }

StatusOr<rpc::ObjectLocation> CoreWorker::StoreLarge(const rpc::TaskSpec& spec, int index,
                                                     size_t size,
                                                     const std::function<void(char*)>& write) {
  const std::string id = ReturnIdOf(spec.return_id(), index);
  auto stored = CreateInStore(id, HexOf(id) + ".r" + std::to_string(spec.attempt()), size,
                              spec.owner_address());
  if (stored.ok()) WriteInStore(*stored, write);
  return stored;
}

void CoreWorker::ReportActorExit(const std::string& actor_id) {
  head_->ReportActorExit(actor_id, opts_.worker_id);
}

void CoreWorker::ReturnLease(const std::string& lease_id) {
  rpc::ReturnLeaseRequest req;
  req.set_lease_id(lease_id);
  rpc::Empty e;
  auto rctx = NewContext(opts_.token, 5000);
  (void)node_->ReturnLease(rctx.get(), req, &e);
}

}  // namespace torus::core
