#include "node/node.h"

#include <signal.h>
#include <sys/mman.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cmath>
#include <optional>
#include <set>
#include <cstring>
#include <iterator>
#include <thread>

#include "common/env_key.h"
#include "common/ids.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/session.h"
#include "common/shm.h"
#include "common/shm_owner.h"
#include "tpu/chip_visibility.h"
#include "tpu/node_identity.h"

extern char** environ;

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;

// The config with its defaults filled in: a random id, CPU = the number of cores.
NodeConfig WithDefaults(NodeConfig cfg) {
  if (cfg.node_id.empty()) cfg.node_id = RandomHex(14);
  if (!cfg.resources.count("CPU")) {
    cfg.resources["CPU"] = static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
  }
  return cfg;
}

}  // namespace

Node::Node(NodeConfig cfg)
    : cfg_(WithDefaults(std::move(cfg))),
      log_files_(cfg_.serve_session_logs && !cfg_.session_dir.empty() ? cfg_.session_dir + "/logs" : ""),
      st_(cfg_.node_id, ToAmounts(cfg_.resources)),
      heads_(std::make_shared<torus::HeadAddresses>(cfg_.head_address)) {
  shm_prefix_ = "torus." + cfg_.node_id.substr(0, 12) + ".";
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  hostname_ = host;
  heartbeat_ = std::make_unique<Heartbeat>(
      Heartbeat::Config{heads_, cfg_.token, cfg_.heartbeat_ms, cfg_.head_lost_ms},
      Heartbeat::Hooks{[this](rpc::HeartbeatRequest* req) { return FillHeartbeat(req); },
                       [this](const rpc::HeartbeatRequest& req, const rpc::HeartbeatReply& reply) {
                         ApplyHeartbeat(req, reply);
                       },
                       [this](const grpc::Status& last) { GiveUp(last); }});
  peer_watch_ = std::make_unique<PeerWatch>(cfg_.token, cfg_.node_id, [this](const std::string& id, const std::string& how) {
    return ReportPeerLost(id, how);
  });
  lease_audit_ = std::make_unique<LeaseAudit>(
      cfg_.token, LeaseAudit::Hooks{[this](std::chrono::milliseconds age) { return leases_.AuditDue(age); },
                                    [this](const LeaseAudit::Question& q, rpc::CheckLeaseReply::Use use) {
                                      leases_.AuditAnswered(q, use, lease_audit_->check_age());
                                    }});
}

Node::~Node() {
  Stop();
  // Stop() run by the heartbeat thread itself (giving up) could not join that thread.
  heartbeat_.reset();
  shutdown_.Join();
  // Destroying the server joins its RPC threads, so no handler still reads a part (object
  // store, leases) that the member destructors below tear down.
  server_.reset();
}

Status Node::DetectTpu(ResourceMap* total) {
  // User labels may not claim a reserved key; the node's own identity sets them.
  if (auto s = ValidateUserLabels(cfg_.labels, "node labels"); !s.ok()) return s;
  cfg_.labels[std::string(kLabelNodeId)] = cfg_.node_id;
  cfg_.labels[std::string(kLabelHostname)] = hostname_;
  if (!cfg_.node_group.empty()) cfg_.labels[std::string(kLabelNodeGroup)] = cfg_.node_group;
  tpu::EnvMap env;
  for (char** e = environ; *e; ++e) {
    const char* eq = strchr(*e, '=');
    if (eq) env[std::string(*e, eq - *e)] = eq + 1;
  }
  std::optional<double> explicit_tpu;
  if (auto it = cfg_.resources.find("TPU"); it != cfg_.resources.end()) explicit_tpu = it->second;
  auto id = tpu::ComputeNodeTpuIdentity(tpu::NodeTpuInputFromEnv(env, explicit_tpu));
  if (!id.ok()) return id.status();
  for (const auto& w : id->warnings) TORUS_LOG(WARNING) << "TPU identity: " << w;
  if (id->chips <= 0) {
    total->erase("TPU");
    return Status::Ok();
  }
  for (const auto& [k, v] : id->labels) cfg_.labels[k] = v;
  for (const auto& [k, v] : id->resources) (*total)[k] = v;
  tpu_chip_ids_ = id->chip_ids;
  TORUS_LOG(INFO) << "TPU node: " << id->chips << " chip(s)"
                  << (id->slice_name ? ", slice " + *id->slice_name : std::string())
                  << (id->worker_id ? ", worker " + std::to_string(*id->worker_id) : std::string())
                  << (id->pod_type ? ", " + id->pod_type->normalized : std::string());
  return Status::Ok();
}

Status Node::SizeArenaAndMemory(ResourceMap* total) {
  // Segments of nodes of this session that died without cleaning up (SIGKILL) go first; then
  // this node's lock tells later cleaners and siblings that its segments are alive.
  size_t siblings = 0;
  if (!cfg_.session_dir.empty()) {
    CleanDeadNodeSegments(cfg_.session_dir);
    siblings = LiveArenaBytes(SessionRoot()).size();
    auto lock = ShmOwnerLock::Acquire(cfg_.session_dir, shm_prefix_, 0);
    if (lock.ok()) {
      shm_lock_ = std::move(*lock);
    } else {
      TORUS_LOG(WARNING) << "no shared-memory owner lock (" << lock.status().message()
                         << "): a later cleaner cannot tell this node's segments are alive";
    }
  }
  int expected = 0;
  if (const char* v = getenv("TORUS_HOST_NODES"); v && *v) expected = atoi(v);
  double ram = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * sysconf(_SC_PAGE_SIZE);
  if (!cfg_.resources.count("memory")) {
    // As Ray: a "memory" resource (bytes) that work may reserve; 70% of RAM by default, shared
    // among the nodes of this host.
    (*total)["memory"] = std::floor(ram * 0.7 / HostShare(siblings, expected));
  }
  if (cfg_.object_store_bytes == 0) {
    uint64_t shm_free = static_cast<uint64_t>(ram);
    struct statvfs vfs;
    if (statvfs("/dev/shm", &vfs) == 0) shm_free = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize;
    cfg_.object_store_bytes = DefaultArenaBytes(static_cast<uint64_t>(ram), shm_free, siblings, expected);
  }
  shm_lock_.SetArenaBytes(cfg_.object_store_bytes);
  return Status::Ok();
}

Status Node::Start() {
  if (auto s = ValidateToken(cfg_.token, "the node's configuration"); !s.ok()) return s;
  if (auto s = ValidateResources(cfg_.resources, "node resources"); !s.ok()) return s;
  ResourceMap total = ToAmounts(cfg_.resources);
  if (auto s = DetectTpu(&total); !s.ok()) return s;
  if (auto s = SizeArenaAndMemory(&total); !s.ok()) return s;
  {
    MutexLock lock(st_.mu);
    st_.ledger.Reset(std::move(total), tpu_chip_ids_);
  }
  UnlinkSegmentsWithPrefix(shm_prefix_);
  // One subdirectory per node, also under a configured directory several nodes may share.
  const std::string spill_dir =
      (!cfg_.spill_dir.empty() ? cfg_.spill_dir
                               : (cfg_.session_dir.empty() ? std::string("/tmp/torus") : cfg_.session_dir) + "/spill") +
      "/" + cfg_.node_id.substr(0, 12);
  if (auto s = objects_.Open(shm_prefix_ + "arena", cfg_.object_store_bytes, spill_dir); !s.ok()) return s;
  log_files_.ClaimOwnOutput();
  job_runner_ = std::make_unique<JobRunner>(JobRunnerConfig{
      cfg_.node_id, cfg_.token, cfg_.bind_host, static_cast<int>(tpu_chip_ids_.size()), &log_files_});
  if (auto s = StartHttp(); !s.ok()) {
    UnlinkSegmentsWithPrefix(shm_prefix_);
    return s;
  }
  if (auto s = Serve(); !s.ok()) return s;
  job_runner_->SetSessionDir(cfg_.session_dir);
  {
    MutexLock lock(st_.mu);
    st_.pool.Configure({cfg_.node_id, address_, cfg_.bind_host, cfg_.token, cfg_.session_dir, heads_,
                        cfg_.torus_exe, cfg_.logs_dir, static_cast<int>(tpu_chip_ids_.size()), &log_files_});
    TORUS_LOG(INFO) << "node " << cfg_.node_id << " listening on " << address_ << " resources "
                    << ResourcesToString(st_.ledger.total());
  }
  heartbeat_->Start();
  reaper_thread_ = std::thread([this] { ReaperLoop(); });
  lease_audit_->Start();
  serving_ = true;
  return Status::Ok();
}

Status Node::Serve() {
  int port = cfg_.port;
  lane_ = std::make_unique<LaneServer>(cfg_.token, "node " + cfg_.node_id);
  lane_->HandleRaw("/torus.rpc.Node/PrepareBundles",
                   [this](std::string_view in, std::string* out) { return bundles_.Lane(true, in, out); });
  lane_->Handle("/torus.rpc.Node/CommitBundles", this, &rpc::Node::Service::CommitBundles);
  lane_->HandleStream(kWatchMethod, [this](LaneServerStream* s) { return ServeWatch(s); });
  lane_->HandleRaw("/torus.rpc.Node/ReleaseBundles",
                   [this](std::string_view in, std::string* out) { return bundles_.Lane(false, in, out); });
  if (lane_->Start(cfg_.bind_host) == 0) {
    TORUS_LOG(WARNING) << "node: no lane port on " << cfg_.bind_host << "; bundle calls use gRPC";
  }
  std::string why;
  server_ = StartServer(cfg_.bind_host, &port, {this, job_runner_.get(), lane_.get()}, 0, &why);
  if (server_ && lane_) lane_->SetGrpcPort(port);
  if (!server_ || port == 0) {
    lane_->Stop();
    UnlinkSegmentsWithPrefix(shm_prefix_);
    return Unavailable("node cannot listen on " + cfg_.bind_host + ":" + std::to_string(cfg_.port) + ": " + why);
  }
  address_ = cfg_.bind_host + ":" + std::to_string(port);
  RegisterInProcessServer(address_, server_.get(), this);
  // Each address given (--address A,B: a head and its standbys) is tried once.
  Status reg = RegisterWithHead();
  for (size_t i = 1; i < torus::HeadAddresses::Split(cfg_.head_address).size() && reg.code() == StatusCode::kUnavailable;
       ++i) {
    reg = RegisterWithHead();
  }
  registered_ = reg.ok();
  if (auto s = reg; !s.ok()) {
    UnregisterInProcessServer(address_);
    server_->Shutdown();
    lane_->Stop();
    UnlinkSegmentsWithPrefix(shm_prefix_);
    return s;
  }
  return Status::Ok();
}

Status Node::RegisterWithHead() {
  rpc::RegisterNodeRequest req;
  auto* n = req.mutable_node();
  n->set_node_id(cfg_.node_id);
  n->set_address(address_);
  req.set_lane_port(lane_ ? lane_->port() : 0);
  if (lane_) req.set_lane_unix(lane_->unix_name());
  n->set_hostname(hostname_);
  n->set_pid(getpid());
  n->set_is_head_node(cfg_.serve_session_logs);  // only the head's own node serves the session's logs
  n->set_alive(true);
  {
    MutexLock lock(st_.mu);
    ToProto(st_.ledger.total(), n->mutable_total());
    ToProto(st_.ledger.available(), n->mutable_available());
    for (const auto& [pg_id, bundles] : st_.ledger.bundles()) {
      auto* h = req.add_held();
      h->set_pg_id(pg_id);
      for (const auto& [index, b] : bundles) h->add_indexes(index);
    }
    req.set_ledger_seq(st_.ledger.seq());
  }
  for (const auto& [k, v] : cfg_.labels) (*n->mutable_labels())[k] = v;
  rpc::RegisterNodeReply reply;
  auto ctx = NewContext(cfg_.token, 10000);
  const std::string head = heads_->current();
  auto st = HeadStub()->RegisterNode(ctx.get(), req, &reply);
  if (!st.ok()) {
    heads_->Failed(head);
    return FromGrpc(st, "cannot register with head at " + head);
  }
  heads_->Learn({reply.head_addresses().begin(), reply.head_addresses().end()}, reply.heads_version());
  if (reply.has_error() && reply.error().code() != 0) {
    return Status(static_cast<StatusCode>(reply.error().code()), reply.error().message());
  }
  if (cfg_.session_dir.empty()) cfg_.session_dir = reply.session_dir();
  heartbeat_->SetHeadPacing(reply.heartbeat_ms());
  peer_watch_->SetTarget(reply.watch());
  return Status::Ok();
}

Status Node::StartHttp() {
  if (cfg_.agent_port < 0) return Status::Ok();
  HttpServer::Options o;
  o.name = "node agent";
  o.host = cfg_.agent_host;
  o.port = cfg_.agent_port;
  o.any_port_if_taken = cfg_.agent_port_fallback;
  o.threads = 2;  // handlers only: connections hold no thread
  o.token = cfg_.token;
  http_ = std::make_unique<HttpServer>(o);
  // KubeRay's liveness/readiness probe of every pod (Ray's answer: 200 "success").
  http_->Handle("GET", "/api/local_raylet_healthz", HttpServer::Access::kPublic, [this](const HttpRequest&) {
    if (st_.stopping) return HttpResponse::Text("Local Raylet failed: the node is stopping", 503);
    if (!serving_) return HttpResponse::Text("Local Raylet failed: the node is not registered yet", 503);
    return HttpResponse::Text("success");
  }, HttpServer::Lane::kProbe);
  ServeMetrics(*http_, [this] { return CollectMetrics(); });
  if (auto s = http_->Start(); !s.ok()) {
    http_.reset();
    return s;
  }
  return Status::Ok();
}

void Node::Wait() {
  MutexLock lock(stop_mu_);
  while (!stopped_) stopped_cv_.Wait(lock);
}

void Node::Stop() {
  if (st_.stopping.exchange(true)) {
    Wait();
    return;
  }
  TORUS_LOG(INFO) << "node " << cfg_.node_id << " stopping";
  peer_watch_->Stop();  // nothing more to report
  if (http_) http_->Stop();
  if (job_runner_) job_runner_->Stop();
  objects_.Clear();
  std::vector<pid_t> pids;
  {
    MutexLock lock(st_.mu);
    pids = st_.pool.StopAll();
    leases_.AssertHeld();  // NodeState::mu
    leases_.FailAllLocked(Unavailable("node " + cfg_.node_id + " is shutting down"));
    st_.cv.NotifyAll();
  }
  for (pid_t p : pids) kill(p, SIGTERM);
  {
    // The reaper reaps them (and notifies the cv); what is left after 1.5 s gets SIGKILL.
    MutexLock lock(st_.mu);
    WaitForExitsLocked(lock, pids);
  }
  for (pid_t p : pids) kill(p, SIGKILL);
  UnlinkSegmentsWithPrefix(shm_prefix_);
  shm_lock_.Release();
  if (registered_) {
    rpc::UnregisterNodeRequest req;
    req.set_node_id(cfg_.node_id);
    rpc::Empty e;
    auto ctx = NewContext(cfg_.token, 1000);
    (void)HeadStub()->UnregisterNode(ctx.get(), req, &e);
  }
  st_.reaper_waiter.Wake();
  heartbeat_->Stop();  // from the heartbeat thread itself (giving up): not joined here
  if (reaper_thread_.joinable()) reaper_thread_.join();
  lease_audit_->Stop();
  UnregisterInProcessServer(address_);
  if (lane_) lane_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  MutexLock lock(stop_mu_);
  stopped_ = true;
  stopped_cv_.NotifyAll();
}

void Node::WaitForExitsLocked(MutexLock& lock, const std::vector<pid_t>& pids) {
  auto deadline = Clock::now() + std::chrono::milliseconds(1500);
  while (true) {
    bool left = false;
    for (pid_t p : pids) left = left || st_.pool.HasPid(p);
    if (!left || !st_.cv.WaitUntil(lock, deadline)) return;
  }
}

// ------------------------------------------------------------------------------- workers

grpc::Status Node::RegisterWorker(grpc::ServerContext* ctx, const rpc::RegisterWorkerRequest* req,
                                  rpc::RegisterWorkerReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  {
    MutexLock lock(st_.mu);
    if (req->is_driver()) {
      st_.pool.AddDriver(req->worker_id(), req->pid(), req->address());
      if (req->warm_workers() > 0 && req->warm_command_size() > 0 && !req->job_id().empty()) {
        // The same key as the driver's leases and actors without runtime_env of their own.
        WorkerSpawn spawn;
        spawn.job_id = req->job_id();
        spawn.command.assign(req->warm_command().begin(), req->warm_command().end());
        spawn.env_vars = &req->warm_env_vars();
        st_.pool.SetWarm(WorkerPool::JobKey(req->job_id(), CommandKey(req->warm_command()) +
                                                               EnvVarsKey(req->warm_env_vars())),
                         spawn, req->warm_workers());
        if (auto s = st_.pool.Refill(); !s.ok()) {
          TORUS_LOG(WARNING) << "cannot start warm workers for job " << req->job_id() << ": " << s.message();
        }
      }
    } else if (!st_.pool.Registered(req->worker_id(), req->address())) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "worker " + req->worker_id() + " was not started by this node");
    } else {
      leases_.AssertHeld();  // NodeState::mu
      leases_.ScheduleLocked();
      st_.cv.NotifyAll();
    }
  }
  reply->set_node_id(cfg_.node_id);
  reply->set_head_address(heads_->joined());
  reply->set_session_dir(cfg_.session_dir);
  reply->set_shm_prefix(shm_prefix_);
  reply->set_node_address(address_);
  reply->set_arena_name(objects_.name());
  reply->set_arena_capacity(objects_.capacity());
  return grpc::Status::OK;
}

grpc::Status Node::RequestLease(grpc::ServerContext* ctx, const rpc::LeaseRequest* req,
                                rpc::LeaseReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return leases_.Request(ctx, *req, reply);
}

grpc::Status Node::ReturnLease(grpc::ServerContext* ctx, const rpc::ReturnLeaseRequest* req,
                               rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  leases_.Return(req->lease_id(), req->worker_dead());
  return grpc::Status::OK;
}

grpc::Status Node::NotifyBlocked(grpc::ServerContext* ctx, const rpc::BlockedRequest* req,
                                 rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  leases_.Blocked(req->worker_id(), req->blocked());
  return grpc::Status::OK;
}

grpc::Status Node::StartActor(grpc::ServerContext* ctx, const rpc::StartActorRequest* req,
                              rpc::StartActorReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  actors_.Start(*req, reply);
  return grpc::Status::OK;
}

grpc::Status Node::KillWorker(grpc::ServerContext* ctx, const rpc::KillWorkerRequest* req,
                              rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(st_.mu);
  Worker* w = st_.pool.Find(req->worker_id());
  if (!w || w->state == WorkerState::kDriver) return grpc::Status::OK;
  w->kill_requested = true;
  if (w->pid > 0) kill(w->pid, req->force() ? SIGKILL : SIGTERM);
  return grpc::Status::OK;
}

grpc::Status Node::GetWorkerExit(grpc::ServerContext* ctx, const rpc::WorkerExitRequest* req,
                                 rpc::WorkerExitReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(st_.mu);
  // The caller usually sees the broken connection before our reaper sees the exit: wait a bit.
  std::string description;
  int code = 0;
  auto deadline = Clock::now() + std::chrono::milliseconds(1000);
  bool exited = st_.pool.LookupExit(req->worker_id(), &description, &code);
  while (!exited && st_.cv.WaitUntil(lock, deadline)) {
    exited = st_.pool.LookupExit(req->worker_id(), &description, &code);
  }
  if (!exited) exited = st_.pool.LookupExit(req->worker_id(), &description, &code);
  reply->set_known(exited || st_.pool.Known(req->worker_id()));
  if (exited) {
    reply->set_exited(true);
    reply->set_description(description);
    if (code != 0) reply->set_code(code);
  }
  return grpc::Status::OK;
}

void Node::HandleWorkerExit(pid_t pid, int status) {
  std::string desc = DescribeWaitStatus(status);
  std::string actor_id, worker_id;
  bool intentional = false;
  {
    MutexLock lock(st_.mu);
    std::unique_ptr<Worker> gone = st_.pool.TakeExited(pid);
    if (!gone) return;
    Worker& w = *gone;
    worker_id = w.id;
    intentional = w.kill_requested;
    if (w.state == WorkerState::kStarting && !intentional) {
      TORUS_LOG(ERROR) << "worker " << w.id << " (pid " << pid << ") " << desc
                       << " before registering; see its log in " << cfg_.session_dir << "/logs";
    } else if (!intentional && status != 0) {
      TORUS_LOG(WARNING) << "worker " << w.id << " (pid " << pid << ") " << desc;
    } else if (!intentional) {  // an actor that ended itself (out of scope, exit_actor)
      TORUS_LOG(DEBUG) << "worker " << w.id << " (pid " << pid << ") " << desc;
    }
    leases_.AssertHeld();  // NodeState::mu
    if (!w.lease_id.empty()) leases_.ForgetLeaseLocked(w.lease_id);
    if (w.state == WorkerState::kActor) actor_id = w.actor_id;
    st_.ledger.Return(&w.hold);
    int code = 0;
    if (!w.end_reason.empty()) {
      desc = w.end_reason;
      if (desc.rfind("SliceLost", 0) == 0) code = static_cast<int>(StatusCode::kSliceLost);
    }
    st_.pool.RecordExit(worker_id, desc, code);
    leases_.ScheduleLocked();
    st_.cv.NotifyAll();
  }
  if (!actor_id.empty() && !st_.stopping) {
    rpc::ActorWorkerDiedRequest req;
    req.set_actor_id(actor_id);
    req.set_worker_id(worker_id);
    req.set_description("the actor's worker process " + desc);
    req.set_intentional(false);
    rpc::Empty e;
    auto ctx = NewContext(cfg_.token, 5000);
    auto st = HeadStub()->ActorWorkerDied(ctx.get(), req, &e);
    if (!st.ok()) TORUS_LOG(WARNING) << "cannot report actor death: " << st.error_message();
  }
}

void Node::ReaperLoop() {
  // waitpid() on our own workers only: an embedded node lives inside a user's driver process,
  // whose other children are none of our business.
  auto reap_once = [this] {
    std::vector<pid_t> pids;
    {
      MutexLock lock(st_.mu);
      pids = st_.pool.Pids();
    }
    bool any = false;
    for (pid_t pid : pids) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) == pid) {
        HandleWorkerExit(pid, status);
        any = true;
      }
    }
    return std::make_pair(any, pids);
  };
  while (!st_.stopping) {
    auto [any, pids] = reap_once();
    if (!any) st_.reaper_waiter.Wait(pids, 1000);
  }
  // After Stop(): reap what is left for up to 2 s, asleep until one exits.
  auto deadline = Clock::now() + std::chrono::seconds(2);
  while (true) {
    auto [any, pids] = reap_once();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (pids.empty() || left.count() <= 0) break;
    if (!any) st_.reaper_waiter.Wait(pids, static_cast<int>(left.count()));
  }
}

// ------------------------------------------------------------------------------- heartbeats

bool Node::FillHeartbeat(rpc::HeartbeatRequest* req) {
  if (st_.stopping) return false;
  req->set_node_id(cfg_.node_id);
  req->set_watching(peer_watch_->watching());
  req->set_jobs_epoch(jobs_epoch_);
  req->set_jobs_seq(jobs_seq_);
  std::vector<pid_t> to_kill;
  {
    MutexLock lock(st_.mu);
    ToProto(st_.ledger.available(), req->mutable_available());
    req->set_ledger_seq(st_.ledger.seq());
    leases_.AssertHeld();  // NodeState::mu
    leases_.FillHeartbeatLocked(req);
    to_kill = IdleToStopLocked();
    if (auto s = st_.pool.Refill(); !s.ok()) TORUS_LOG(WARNING) << "cannot start warm workers: " << s.message();
  }
  for (pid_t p : to_kill) kill(p, SIGTERM);
  return true;
}

void Node::ApplyHeartbeat(const rpc::HeartbeatRequest& req, const rpc::HeartbeatReply& reply) {
  if (reply.unknown_node()) {
    TORUS_LOG(WARNING) << "head does not know this node; registering again";
    (void)RegisterWithHead();
    return;
  }
  if (reply.has_watch()) peer_watch_->SetTarget(reply.watch());
  jobs_epoch_ = reply.jobs_epoch();
  jobs_seq_ = reply.jobs_seq();
  if (reply.finished_jobs_size() > 0) StopFinishedJobsWorkers(reply.finished_jobs());
  if (reply.view_version() == req.view_version()) return;
  leases_.ApplyView(reply);
}

std::vector<pid_t> Node::IdleToStopLocked() {
  // Idle workers of finished jobs; idle workers beyond the CPU count once idle long enough.
  auto cpu = st_.ledger.total().find("CPU");
  int keep = cpu != st_.ledger.total().end() ? static_cast<int>(cpu->second.Whole()) : 1;
  return st_.pool.PickIdleToStop(keep, std::chrono::milliseconds(cfg_.idle_worker_keep_ms));
}

void Node::StopFinishedJobsWorkers(const google::protobuf::RepeatedPtrField<std::string>& jobs) {
  std::vector<pid_t> to_kill;
  {
    MutexLock lock(st_.mu);
    for (const auto& j : jobs) st_.pool.JobFinished(j);
    to_kill = IdleToStopLocked();
  }
  for (pid_t p : to_kill) kill(p, SIGTERM);
}

void Node::GiveUp(const grpc::Status& last) {
  const bool refused = last.error_code() == grpc::StatusCode::UNAUTHENTICATED;
  TORUS_LOG(ERROR) << "node " << cfg_.node_id << ": giving up after " << cfg_.head_lost_ms
                   << " ms without a successful heartbeat: the head at " << heads_->joined()
                   << (refused ? " refuses this node's cluster token (it was restarted: a new head is a new "
                                 "session this node cannot join)"
                               : " cannot be reached")
                   << " (last error: " << last.error_message()
                   << "); stopping the workers and jobs, freeing the shared memory, exiting";
  gave_up_ = true;
  Stop();  // from this thread: Stop() does not join it, the destructor does
}

// ------------------------------------------------------------------------------- objects

grpc::Status Node::CreateObject(grpc::ServerContext* ctx, const rpc::CreateObjectRequest* req,
                                rpc::CreateObjectReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  grpc::Status st = objects_.Create(*req, reply);
  // A creation that waited for spills past the caller's deadline: the caller has given up.
  if (st.ok() && !reply->has_error() && ctx->IsCancelled()) {
    objects_.Abandon(req->key(), reply->offset(), /*created=*/true);
    return grpc::Status(grpc::StatusCode::CANCELLED, "the caller gave up");
  }
  return st;
}

grpc::Status Node::FreeObjects(grpc::ServerContext* ctx, const rpc::FreeObjectsRequest* req,
                               rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  objects_.Free(*req);
  return grpc::Status::OK;
}

grpc::Status Node::RestoreObject(grpc::ServerContext* ctx, const rpc::RestoreObjectRequest* req,
                                 rpc::CreateObjectReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  objects_.Restore(req->key(), reply);
  if (!reply->has_error() && ctx->IsCancelled()) {
    objects_.Abandon(req->key(), reply->offset(), /*created=*/false);
    return grpc::Status(grpc::StatusCode::CANCELLED, "the caller gave up");
  }
  return grpc::Status::OK;
}

grpc::Status Node::FetchObject(grpc::ServerContext* ctx, const rpc::FetchObjectRequest* req,
                               grpc::ServerWriter<rpc::ObjectChunk>* writer) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return objects_.Fetch(*req, writer);
}

grpc::Status Node::ListLogs(grpc::ServerContext* ctx, const rpc::Empty*, rpc::LogFileList* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  *reply = log_files_.List();
  return grpc::Status::OK;
}

grpc::Status Node::ReadLog(grpc::ServerContext* ctx, const rpc::ReadLogRequest* req, rpc::ReadLogReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return ToGrpc(log_files_.Read(*req, reply));
}

grpc::Status Node::HeadAddresses(grpc::ServerContext* ctx, const rpc::Empty*, rpc::HeadAddressesReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  for (auto& a : torus::HeadAddresses::Split(heads_->joined())) reply->add_addresses(std::move(a));
  return grpc::Status::OK;
}

// ------------------------------------------------------------------------------- watch ring

grpc::Status Node::SetWatch(grpc::ServerContext* ctx, const rpc::WatchTarget* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  if (req->node_id() == cfg_.node_id) return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "a node does not watch itself");
  peer_watch_->SetTarget(*req);
  return grpc::Status::OK;
}

grpc::Status Node::Ping(grpc::ServerContext* ctx, const rpc::PingRequest* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  if (req->node_id() != cfg_.node_id) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this is node " + cfg_.node_id + ", not " + req->node_id());
  }
  if (st_.stopping) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "node " + cfg_.node_id + " is stopping");
  return grpc::Status::OK;
}

grpc::Status Node::ServeWatch(LaneServerStream* s) {
  rpc::WatchHello hello;
  if (!s->Read(&hello)) return grpc::Status::OK;
  if (hello.node_id() != cfg_.node_id) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this is node " + cfg_.node_id + ", not " + hello.node_id());
  }
  // Acknowledged, then held open, silent, until the watcher goes or this node stops (the lane
  // closes it).
  if (!s->Write(hello)) return grpc::Status::OK;
  while (s->Read(&hello)) {
  }
  return grpc::Status::OK;
}

bool Node::ReportPeerLost(const std::string& node_id, const std::string& how) {
  rpc::PeerLostRequest req;
  req.set_watcher_id(cfg_.node_id);
  req.set_node_id(node_id);
  req.set_how(how);
  rpc::Empty e;
  auto ctx = NewContext(cfg_.token, 2000);
  if (auto st = HeadStub()->ReportPeerLost(ctx.get(), req, &e); !st.ok()) {
    TORUS_LOG(WARNING) << "could not tell the head that the watch link to node " << node_id
                       << " ended: " << st.error_message() << " (telling it again)";
    return false;
  }
  return true;
}

grpc::Status Node::Info(grpc::ServerContext* ctx, const rpc::Empty*, rpc::NodeInfoReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  reply->set_node_id(cfg_.node_id);
  objects_.FillInfo(reply);
  MutexLock lock(st_.mu);
  ToProto(st_.ledger.total(), reply->mutable_total());
  ToProto(st_.ledger.available(), reply->mutable_available());
  int idle = 0, n = 0;
  for (const auto& [id, w] : st_.pool.workers()) {
    if (w->state == WorkerState::kDriver) continue;
    ++n;
    idle += w->state == WorkerState::kIdle;
    auto* wi = reply->add_workers();
    wi->set_worker_id(id);
    wi->set_pid(w->pid);
    wi->set_address(w->address);
    wi->set_state(w->hold.blocked ? rpc::WorkerInfo::BLOCKED : WireState(w->state));
    wi->set_actor_id(w->actor_id);
    wi->set_job_id(w->job_id);
  }
  reply->set_num_workers(n);
  reply->set_num_idle_workers(idle);
  for (const auto& [pg, bs] : st_.ledger.bundles()) {
    for (const auto& [idx, b] : bs) {
      auto* bi = reply->add_bundles();
      bi->set_pg_id(pg);
      bi->set_index(idx);
      ToProto(b.total, bi->mutable_total());
      ToProto(b.available, bi->mutable_available());
      bi->set_committed(b.committed);
    }
  }
  return grpc::Status::OK;
}

// ------------------------------------------------------------------------------- bundles

grpc::Status Node::PrepareBundles(grpc::ServerContext* ctx, const rpc::BundlesRequest* req,
                                  rpc::PrepareBundlesReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  if (auto s = bundles_.CheckAddressee(*req); !s.ok()) return s;
  bundles_.Prepare(*req, reply);
  return grpc::Status::OK;
}

grpc::Status Node::CommitBundles(grpc::ServerContext* ctx, const rpc::BundlesRequest* req,
                                 rpc::PrepareBundlesReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  if (auto s = bundles_.CheckAddressee(*req); !s.ok()) return s;
  return bundles_.Commit(*req, reply);
}

grpc::Status Node::ReleaseBundles(grpc::ServerContext* ctx, const rpc::BundlesRequest* req,
                                  rpc::PrepareBundlesReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  if (auto s = bundles_.CheckAddressee(*req); !s.ok()) return s;
  bundles_.Release(*req, reply);
  return grpc::Status::OK;
}

grpc::Status Node::Shutdown(grpc::ServerContext* ctx, const rpc::Empty*, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  // Stop() shuts the server down, which waits for this call: it runs on a thread of its own,
  // started once and joined by the destructor.
  shutdown_.Run([this] { Stop(); });
  return grpc::Status::OK;
}

}  // namespace torus
