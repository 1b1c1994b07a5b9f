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
// A request spilled here that still waits may spill again after this long (never sooner, so a
// request cannot bounce between nodes faster than this).
constexpr auto kRespillAfter = std::chrono::milliseconds(1000);

std::string Key(const rpc::LeaseRequest& r) { return r.runtime_key(); }

std::vector<int> BundleIndices(const rpc::BundlesRequest& req) {
  std::vector<int> out;
  for (const auto& b : req.bundles()) out.push_back(b.index());
  return out;
}

// The config with its defaults filled in: a random id, CPU = the number of cores.
NodeConfig WithDefaults(NodeConfig cfg) {
  if (cfg.node_id.empty()) cfg.node_id = RandomHex(14);
  if (!cfg.resources.count("CPU")) {
    cfg.resources["CPU"] = static_cast<double>(std::max(1u, std::thread::hardware_concurrency()));
  }
  return cfg;
}
}  // namespace

Node::Node(NodeConfig cfg) : cfg_(WithDefaults(std::move(cfg))), ledger_(cfg_.node_id, cfg_.resources) {
  shm_prefix_ = "torus." + cfg_.node_id.substr(0, 12) + ".";
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  hostname_ = host;
  heartbeat_ = std::make_unique<Heartbeat>(
      Heartbeat::Config{cfg_.head_address, cfg_.token, cfg_.heartbeat_ms, cfg_.head_lost_ms},
      Heartbeat::Hooks{[this](rpc::HeartbeatRequest* req) { return FillHeartbeat(req); },
                       [this](const rpc::HeartbeatRequest& req, const rpc::HeartbeatReply& reply) {
                         ApplyHeartbeat(req, reply);
                       },
                       [this](const grpc::Status& last) { GiveUp(last); }});
  lease_audit_ = std::make_unique<LeaseAudit>(
      cfg_.token, LeaseAudit::Hooks{[this](std::chrono::milliseconds age) { return AuditDue(age); },
                                    [this](const LeaseAudit::Question& q, rpc::CheckLeaseReply::Use use) {
                                      AuditAnswered(q, use);
                                    }});
}

Node::~Node() {
  Stop();
  // Stop() run by the heartbeat thread itself (giving up) could not join that thread.
  heartbeat_.reset();
  shutdown_.Join();
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
  ResourceMap total = cfg_.resources;
  if (auto s = DetectTpu(&total); !s.ok()) return s;
  if (auto s = SizeArenaAndMemory(&total); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ledger_.Reset(std::move(total), tpu_chip_ids_);
  }
  uint64_t cap = cfg_.object_store_bytes;
  UnlinkSegmentsWithPrefix(shm_prefix_);
  arena_name_ = shm_prefix_ + "arena";
  auto arena = CreateSparseSegment(arena_name_, cap);
  if (!arena.ok()) return arena.status();
  arena_ = std::move(*arena);
  // Freed bytes kept resident for reuse: min(capacity / 4, 2 GiB), or
  // TORUS_OBJECT_STORE_RESIDENT_FREE_BYTES (0 = give every freed page back at once).
  uint64_t resident_free = std::min<uint64_t>(cap / 4, 2ull << 30);
  if (const char* v = getenv("TORUS_OBJECT_STORE_RESIDENT_FREE_BYTES"); v && *v) {
    char* end = nullptr;
    errno = 0;
    unsigned long long n = strtoull(v, &end, 10);
    if (errno == 0 && end && *end == '\0' && v[0] != '-') {
      resident_free = n;
    } else {
      TORUS_LOG(WARNING) << "TORUS_OBJECT_STORE_RESIDENT_FREE_BYTES='" << v
                         << "' is not a byte count; keeping " << resident_free << " bytes resident";
    }
  }
  arena_alloc_ = std::make_unique<ArenaAllocator>(cap, resident_free);
  int port = cfg_.port;
  job_runner_ = std::make_unique<JobRunner>(JobRunnerConfig{
      cfg_.node_id, cfg_.token, cfg_.bind_host, static_cast<int>(tpu_chip_ids_.size())});
  lane_ = std::make_unique<LaneServer>(cfg_.token, "node " + cfg_.node_id);
  lane_->HandleRaw("/torus.rpc.Node/PrepareBundles",
                   [this](std::string_view in, std::string* out) { return LaneBundles(true, in, out); });
  lane_->Handle("/torus.rpc.Node/CommitBundles", this, &rpc::Node::Service::CommitBundles);
  lane_->HandleRaw("/torus.rpc.Node/ReleaseBundles",
                   [this](std::string_view in, std::string* out) { return LaneBundles(false, in, out); });
  if (lane_->Start(cfg_.bind_host) == 0) {
    TORUS_LOG(WARNING) << "node: no lane port on " << cfg_.bind_host << "; bundle calls use gRPC";
  }
  std::string why;
  server_ = StartServer(cfg_.bind_host, &port, {this, job_runner_.get(), lane_.get()}, 0, &why);
  if (!server_ || port == 0) {
    lane_->Stop();
    UnlinkSegmentsWithPrefix(shm_prefix_);
    return Unavailable("node cannot listen on " + cfg_.bind_host + ":" + std::to_string(cfg_.port) + ": " + why);
  }
  address_ = cfg_.bind_host + ":" + std::to_string(port);
  RegisterInProcessServer(address_, server_.get(), this);
  head_ = rpc::Head::NewStub(GetChannel(cfg_.head_address));
  if (auto s = RegisterWithHead(); !s.ok()) {
    UnregisterInProcessServer(address_);
    server_->Shutdown();
    lane_->Stop();
    UnlinkSegmentsWithPrefix(shm_prefix_);
    return s;
  }
  job_runner_->SetSessionDir(cfg_.session_dir);
  {
    std::lock_guard<std::mutex> lock(mu_);
    pool_.Configure({cfg_.node_id, address_, cfg_.bind_host, cfg_.token, cfg_.session_dir, cfg_.head_address,
                     cfg_.torus_exe, cfg_.logs_dir, static_cast<int>(tpu_chip_ids_.size())});
  }
  TORUS_LOG(INFO) << "node " << cfg_.node_id << " listening on " << address_ << " resources "
                  << ResourcesToString(ledger_.total());
  heartbeat_->Start();
  reaper_thread_ = std::thread([this] { ReaperLoop(); });
  lease_audit_->Start();
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
  n->set_alive(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ToProto(ledger_.total(), n->mutable_total());
    ToProto(ledger_.available(), n->mutable_available());
  }
  for (const auto& [k, v] : cfg_.labels) (*n->mutable_labels())[k] = v;
  rpc::RegisterNodeReply reply;
  auto ctx = NewContext(cfg_.token, 10000);
  auto st = head_->RegisterNode(ctx.get(), req, &reply);
  if (!st.ok()) return FromGrpc(st, "cannot register with head at " + cfg_.head_address);
  if (reply.has_error() && reply.error().code() != 0) {
    return Status(static_cast<StatusCode>(reply.error().code()), reply.error().message());
  }
  if (cfg_.session_dir.empty()) cfg_.session_dir = reply.session_dir();
  heartbeat_->SetHeadPacing(reply.heartbeat_ms());
  return Status::Ok();
}

void Node::Wait() {
  std::unique_lock<std::mutex> lock(stop_mu_);
  stopped_cv_.wait(lock, [this] { return stopped_; });
}

void Node::Stop() {
  if (stopping_.exchange(true)) {
    Wait();
    return;
  }
  TORUS_LOG(INFO) << "node " << cfg_.node_id << " stopping";
  if (job_runner_) job_runner_->Stop();
  std::vector<pid_t> pids;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pids = pool_.StopAll();
    objects_.clear();
    for (auto& p : pending_) {
      if (!p->done) GiveBackLocked(*p, Unavailable("node " + cfg_.node_id + " is shutting down"));
    }
    cv_.notify_all();
  }
  for (pid_t p : pids) kill(p, SIGTERM);
  {
    // The reaper reaps them (and notifies cv_); what is left after 1.5 s gets SIGKILL.
    auto deadline = Clock::now() + std::chrono::milliseconds(1500);
    std::unique_lock<std::mutex> lock(mu_);
    auto any_left = [&] {
      return std::any_of(pids.begin(), pids.end(), [&](pid_t p) { return pool_.HasPid(p); });
    };
    while (any_left() && cv_.wait_until(lock, deadline) != std::cv_status::timeout) {
    }
  }
  for (pid_t p : pids) kill(p, SIGKILL);
  UnlinkSegmentsWithPrefix(shm_prefix_);
  shm_lock_.Release();
  if (head_) {
    rpc::UnregisterNodeRequest req;
    req.set_node_id(cfg_.node_id);
    rpc::Empty e;
    auto ctx = NewContext(cfg_.token, 1000);
    (void)head_->UnregisterNode(ctx.get(), req, &e);
  }
  reaper_waiter_.Wake();
  heartbeat_->Stop();  // from the heartbeat thread itself (giving up): not joined here
  if (reaper_thread_.joinable()) reaper_thread_.join();
  lease_audit_->Stop();
  UnregisterInProcessServer(address_);
  if (lane_) lane_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  {
    std::lock_guard<std::mutex> lock(stop_mu_);
    stopped_ = true;
  }
  stopped_cv_.notify_all();
}

// ------------------------------------------------------------------------------- workers

grpc::Status Node::RegisterWorker(grpc::ServerContext* ctx, const rpc::RegisterWorkerRequest* req,
                                  rpc::RegisterWorkerReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (req->is_driver()) {
    pool_.AddDriver(req->worker_id(), req->pid(), req->address());
  } else if (!pool_.Registered(req->worker_id(), req->address())) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "worker " + req->worker_id() + " was not started by this node");
  } else {
    TrySchedule();
    cv_.notify_all();
  }
  reply->set_node_id(cfg_.node_id);
  reply->set_head_address(cfg_.head_address);
  reply->set_session_dir(cfg_.session_dir);
  reply->set_shm_prefix(shm_prefix_);
  reply->set_node_address(address_);
  reply->set_arena_name(arena_name_);
  reply->set_arena_capacity(arena_ ? arena_->size() : 0);
  return grpc::Status::OK;
}

bool Node::AnyNodeCouldFit(const ResourceMap& res, const LabelSelectorTerms& selector) const {
  if (Fits(res, ledger_.total()) && MatchesLabels(selector, cfg_.labels)) return true;
  for (const auto& n : view_) {
    if (n.alive() && n.node_id() != cfg_.node_id && Fits(res, FromProto(n.total())) &&
        MatchesLabels(selector, n.labels())) {
      return true;
    }
  }
  return false;
}

bool Node::TakeFromBundle(PendingLease& p, std::string* error) {
  switch (ledger_.TakeFromBundle(p.req.placement_group_id(), p.req.bundle_index(), p.res, &p.hold, error)) {
    case Ledger::BundleTake::kTaken:
      return true;
    case Ledger::BundleTake::kTooBig:
      if (!p.infeasible) {
        TORUS_LOG(WARNING) << "request " << ResourcesToString(p.res) << " for " << p.req.description()
                           << " asks more than bundle "
                           << (p.req.bundle_index() >= 0 ? std::to_string(p.req.bundle_index()) : "(any)")
                           << " of placement group " << p.req.placement_group_id()
                           << " holds; it stays pending";
        p.infeasible = true;
      }
      return false;
    case Ledger::BundleTake::kWait:
    case Ledger::BundleTake::kMissing:
      return false;
  }
  return false;
}

bool Node::TrySpillback(PendingLease& p) {
  // Spilled here already: it waits its turn, unless it has waited a while and another node has
  // room for it now (then this node's queue is the wrong place, e.g. its workers are stuck).
  bool respill = p.req.spilled();
  if (respill && Clock::now() - p.queued_at < kRespillAfter) return false;
  // Prefer a node that can run it now; else, when this node could never run it, one that could.
  const rpc::NodeRecord* target = nullptr;
  bool local_feasible = respill || (Fits(p.res, ledger_.total()) && MatchesLabels(p.selector, cfg_.labels));
  for (const auto& n : view_) {
    if (!n.alive() || n.node_id() == cfg_.node_id) continue;
    if (!MatchesLabels(p.selector, n.labels())) continue;
    if (Fits(p.res, FromProto(n.available()))) {
      target = &n;
      break;
    }
    if (!local_feasible && !target && Fits(p.res, FromProto(n.total()))) target = &n;
  }
  if (!target) return false;
  p.reply.set_spillback_node_address(target->address());
  p.reply.set_spillback_node_id(target->node_id());
  p.done = true;
  // Optimistically charge the view so a burst does not all go to the same node.
  for (auto& n : view_) {
    if (n.node_id() == target->node_id()) {
      auto avail = FromProto(n.available());
      Subtract(avail, p.res);
      ToProto(avail, n.mutable_available());
    }
  }
  return true;
}

bool Node::HoldResourcesLocked(PendingLease& p, bool* answered) {
  *answered = false;
  if (p.hold.held) return true;
  if (!p.req.placement_group_id().empty()) {
    std::string error;
    if (TakeFromBundle(p, &error)) return true;
    if (!error.empty()) {
      GiveBackLocked(p, NotFound(error));
      *answered = true;
    }
    return false;
  }
  if (MatchesLabels(p.selector, cfg_.labels) && ledger_.TakeFromNode(p.res, &p.hold)) {
    p.infeasible = false;
    return true;
  }
  if (TrySpillback(p)) {
    *answered = true;
    return false;
  }
  if (!AnyNodeCouldFit(p.res, p.selector)) {
    if (!p.infeasible) {
      TORUS_LOG(WARNING) << "infeasible request " << ResourcesToString(p.res) << " for "
                         << p.req.description() << ": no node of the cluster has these resources"
                         << (p.selector.empty() ? "" : " and matching labels")
                         << "; it stays pending until such a node joins";
    }
    p.infeasible = true;
  }
  return false;
}

std::string Node::LeaseWorkerKey(const PendingLease& p) const {
  std::string k = WorkerPool::ChipKey(Key(p.req), p.hold.chips);
  return p.hold.bundle >= 0 ? ledger_.BundleEnvKey(k, p.hold.pg_id, p.hold.bundle) : k;
}

void Node::GrantLocked(PendingLease& p, Worker& w) {
  w.state = WorkerState::kLeased;
  w.lease_id = RandomHex(8);
  w.leased_at = Clock::now();
  w.lease_in_use = false;
  w.hold = std::move(p.hold);  // the worker holds the resources now
  p.hold = Hold{};
  worker_by_lease_[w.lease_id] = w.id;
  p.reply.set_granted(true);
  p.reply.set_lease_id(w.lease_id);
  p.reply.set_worker_id(w.id);
  p.reply.set_worker_address(w.address);
  p.reply.set_node_id(cfg_.node_id);
  p.done = true;
}

bool Node::StartNeededWorkersLocked(const std::map<std::string, WorkerNeed>& need) {
  bool any_done = false;
  for (const auto& [key, n] : need) {
    const PendingLease& e = *n.example;
    WorkerSpawn spawn;
    spawn.exe = e.req.executable();
    spawn.command.assign(e.req.worker_command().begin(), e.req.worker_command().end());
    spawn.code_path.assign(e.req.code_search_path().begin(), e.req.code_search_path().end());
    spawn.chips = e.hold.chips;
    if (e.hold.bundle >= 0) spawn.bundle = ledger_.FindBundle(e.hold.pg_id, e.hold.bundle);
    spawn.env_vars = &e.req.env_vars();
    for (int i = pool_.Starting(key); i < n.count; ++i) {
      if (auto w = pool_.Start(key, spawn); !w.ok()) {
        TORUS_LOG(ERROR) << "cannot start worker: " << w.status().ToString();
        for (auto& p : pending_) {
          if (!p->done && LeaseWorkerKey(*p) == key) {
            GiveBackLocked(*p, Internal(w.status().message()));
            any_done = true;
          }
        }
        return any_done;
      }
    }
  }
  return any_done;
}

void Node::TrySchedule() {
  bool any_done = false;
  std::map<std::string, WorkerNeed> need;  // worker key -> leases waiting for one
  for (auto it = pending_.begin(); it != pending_.end();) {
    PendingLease& p = **it;
    bool answered = false;
    if (p.done) {
      it = pending_.erase(it);
      continue;
    }
    if (!HoldResourcesLocked(p, &answered)) {
      any_done |= answered;
      it = answered ? pending_.erase(it) : std::next(it);
      continue;
    }
    std::string wkey = LeaseWorkerKey(p);
    if (Worker* w = pool_.FindIdle(wkey)) {
      GrantLocked(p, *w);
      any_done = true;
      it = pending_.erase(it);
      continue;
    }
    WorkerNeed& n = need[wkey];
    ++n.count;
    n.example = &p;
    ++it;
  }
  if (StartNeededWorkersLocked(need)) any_done = true;
  if (any_done) cv_.notify_all();
}

grpc::Status Node::RequestLease(grpc::ServerContext* ctx, const rpc::LeaseRequest* req,
                                rpc::LeaseReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  auto p = std::make_shared<PendingLease>();
  p->req = *req;
  p->res = FromProto(req->resources());
  if (auto s = ValidateResources(p->res, "lease request resources"); !s.ok()) {
    reply->mutable_error()->set_code(static_cast<int>(StatusCode::kInvalidArgument));
    reply->mutable_error()->set_message(s.message());
    return grpc::Status::OK;
  }
  if (req->label_selector_size() > 0) {
    std::map<std::string, std::string> sel;
    for (const auto& t : req->label_selector()) sel[t.key()] = t.expr();
    auto terms = ParseLabelSelector(sel);
    if (!terms.ok()) {
      reply->mutable_error()->set_code(static_cast<int>(StatusCode::kInvalidArgument));
      reply->mutable_error()->set_message(terms.status().message());
      return grpc::Status::OK;
    }
    p->selector = *terms;
  }
  for (auto it = p->res.begin(); it != p->res.end();) {
    it = it->second <= 0 ? p->res.erase(it) : std::next(it);
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (stopping_) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "node is shutting down");
  pending_.push_back(p);
  TrySchedule();
  while (!p->done) {
    cv_.wait_for(lock, std::chrono::milliseconds(200));
    if (!p->done && ctx->IsCancelled()) {
      // The requester went away: give back what was set aside for it.
      GiveBackLocked(*p, Status::Ok());
      pending_.remove(p);
      TrySchedule();
      return grpc::Status(grpc::StatusCode::CANCELLED, "lease request cancelled");
    }
  }
  if (p->reply.granted() && ctx->IsCancelled()) {
    // Granted just as the requester gave up: the reply would go nowhere.
    UngrantLocked(*p);
    return grpc::Status(grpc::StatusCode::CANCELLED, "lease request cancelled");
  }
  *reply = p->reply;
  return grpc::Status::OK;
}

grpc::Status Node::ReturnLease(grpc::ServerContext* ctx, const rpc::ReturnLeaseRequest* req,
                               rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  if (EndLeaseLocked(req->lease_id(), req->worker_dead())) TrySchedule();
  return grpc::Status::OK;
}

bool Node::EndLeaseLocked(const std::string& lease_id, bool worker_dead) {
  auto it = worker_by_lease_.find(lease_id);
  if (it == worker_by_lease_.end()) return false;  // already returned, or the worker died
  Worker* found = pool_.Find(it->second);
  worker_by_lease_.erase(it);
  if (!found) return false;
  Worker& w = *found;
  ledger_.Return(&w.hold);
  w.lease_id.clear();
  w.lease_in_use = false;
  if (worker_dead) {
    w.kill_requested = true;
    if (w.pid > 0) kill(w.pid, SIGKILL);
  } else {
    w.state = WorkerState::kIdle;
    w.idle_since = Clock::now();
  }
  return true;
}

void Node::UngrantLocked(PendingLease& p) {
  TORUS_LOG(INFO) << "lease " << p.reply.lease_id() << " of worker " << p.reply.worker_id()
                  << " granted as its requester went away; taken back";
  GiveBackLocked(p, Status::Ok());
  TrySchedule();
}

void Node::GiveBackLocked(PendingLease& p, const Status& why) {
  if (p.reply.granted()) {
    EndLeaseLocked(p.reply.lease_id(), false);  // the worker holds what the grant gave
  } else {
    ledger_.Return(&p.hold);
  }
  p.done = true;
  if (!why.ok()) {
    p.reply.mutable_error()->set_code(static_cast<int>(why.code()));
    p.reply.mutable_error()->set_message(why.message());
  }
}

std::vector<LeaseAudit::Question> Node::AuditDue(std::chrono::milliseconds check_age) {
  std::vector<LeaseAudit::Question> questions;
  if (stopping_) return questions;
  std::lock_guard<std::mutex> lock(mu_);
  auto now = Clock::now();
  for (auto& [id, w] : pool_.workers()) {
    if (w->state == WorkerState::kLeased && !w->lease_in_use && !w->address.empty() &&
        now - w->leased_at >= check_age) {
      questions.push_back({id, w->address, w->lease_id});
    }
  }
  // Queued requests that have waited may spill again (TrySpillback), and only time tells.
  if (!pending_.empty()) TrySchedule();
  return questions;
}

void Node::AuditAnswered(const LeaseAudit::Question& q, rpc::CheckLeaseReply::Use use) {
  std::lock_guard<std::mutex> lock(mu_);
  Worker* w = pool_.Find(q.worker_id);
  if (!w || w->lease_id != q.lease_id) return;
  if (use == rpc::CheckLeaseReply::IN_USE) {
    w->lease_in_use = true;
  } else if (use == rpc::CheckLeaseReply::REVOKED) {
    TORUS_LOG(WARNING) << "took back lease " << q.lease_id << " of worker " << q.worker_id
                       << ": its holder never used it within " << lease_audit_->check_age().count()
                       << " ms (the grant's reply was lost)";
    EndLeaseLocked(q.lease_id, false);
    TrySchedule();
  }
}

grpc::Status Node::NotifyBlocked(grpc::ServerContext* ctx, const rpc::BlockedRequest* req,
                                 rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  Worker* found = pool_.Find(req->worker_id());
  if (!found) return grpc::Status::OK;
  Worker& w = *found;
  if (w.state != WorkerState::kLeased && w.state != WorkerState::kActor) return grpc::Status::OK;
  if (req->blocked() && !w.hold.blocked) {
    ledger_.Block(&w.hold);
    TrySchedule();
  } else if (!req->blocked()) {
    ledger_.Unblock(&w.hold);  // may go below zero briefly: the task resumes regardless
  }
  return grpc::Status::OK;
}

grpc::Status Node::StartActor(grpc::ServerContext* ctx, const rpc::StartActorRequest* req,
                              rpc::StartActorReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  ResourceMap res = FromProto(req->resources());
  if (auto s = ValidateResources(res, "actor resources"); !s.ok()) {
    reply->mutable_error()->set_code(static_cast<int>(StatusCode::kInvalidArgument));
    reply->mutable_error()->set_message(s.message());
    return grpc::Status::OK;
  }
  // The same key as the core worker's runtime_key for this command (core_worker.cc).
  std::string key;
  if (req->worker_command_size()) {
    key = "cmd:";
    for (const auto& a : req->worker_command()) key += a + '\0';
  } else {
    key = req->code_search_path_size() ? "code:" : "exe:";
    key += req->executable();
    for (const auto& p : req->code_search_path()) key += ":" + p;
  }
  key += EnvVarsKey(req->creation().env_vars());
  std::string worker_id, worker_address;
  {
    std::unique_lock<std::mutex> lock(mu_);
    Hold hold;
    if (auto s = ledger_.TakeForActor(req->placement_group_id(), req->bundle_index(), res, &hold); !s.ok()) {
      reply->mutable_error()->set_code(static_cast<int>(s.code()));
      reply->mutable_error()->set_message(s.message());
      return grpc::Status::OK;
    }
    key = WorkerPool::ChipKey(key, hold.chips);
    if (hold.bundle >= 0) key = ledger_.BundleEnvKey(key, hold.pg_id, hold.bundle);
    Worker* w = ActorWorkerLocked(lock, *req, key, hold, reply);
    if (!w) return grpc::Status::OK;
    w->state = WorkerState::kActor;
    w->actor_id = req->creation().actor_id();
    w->hold = std::move(hold);
    worker_id = w->id;
    worker_address = w->address;
  }
  RunConstructor(*req, worker_id, worker_address, reply);
  return grpc::Status::OK;
}

Worker* Node::ActorWorkerLocked(std::unique_lock<std::mutex>& lock, const rpc::StartActorRequest& req,
                                const std::string& key, Hold& hold, rpc::StartActorReply* reply) {
  auto fail = [&](StatusCode code, const std::string& why) -> Worker* {
    ledger_.Return(&hold);
    reply->mutable_error()->set_code(static_cast<int>(code));
    reply->mutable_error()->set_message(why);
    return nullptr;
  };
  if (Worker* w = pool_.FindIdle(key)) return w;
  // A worker started for this actor alone: task leases never take it meanwhile.
  WorkerSpawn spawn;
  spawn.exe = req.executable();
  spawn.command.assign(req.worker_command().begin(), req.worker_command().end());
  spawn.code_path.assign(req.code_search_path().begin(), req.code_search_path().end());
  spawn.chips = hold.chips;
  spawn.reserved_for = req.creation().actor_id();
  if (hold.bundle >= 0) spawn.bundle = ledger_.FindBundle(hold.pg_id, hold.bundle);
  spawn.env_vars = &req.creation().env_vars();
  auto started = pool_.Start(key, spawn);
  if (!started.ok()) return fail(StatusCode::kInternal, started.status().message());
  const std::string id = (*started)->id;
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (true) {
    Worker* w = pool_.Find(id);  // the worker may exit (and leave the pool) while we wait
    if (!w || w->pid <= 0) {
      return fail(StatusCode::kUnavailable, "the actor's worker process exited before it registered (see its log)");
    }
    if (w->state == WorkerState::kIdle) {
      w->reserved_for.clear();
      return w;
    }
    if (stopping_ || cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
      return fail(StatusCode::kUnavailable, "actor worker did not start within 60 s");
    }
  }
}

void Node::RunConstructor(const rpc::StartActorRequest& req, const std::string& worker_id,
                          const std::string& worker_address, rpc::StartActorReply* reply) {
  auto stub = rpc::CoreWorker::NewStub(GetChannel(worker_address));
  auto cctx = NewContext(cfg_.token);
  auto stream = stub->PushTasks(cctx.get());
  rpc::TaskBatch batch;
  *batch.add_tasks() = req.creation();
  rpc::ResultBatch results;
  bool ok = stream->Write(batch) && stream->Read(&results);
  stream->WritesDone();
  auto st = stream->Finish();
  reply->set_worker_id(worker_id);
  reply->set_worker_address(worker_address);
  if (!ok || results.results_size() != 1) {
    reply->mutable_error()->set_code(static_cast<int>(StatusCode::kWorkerDied));
    reply->mutable_error()->set_message("actor worker died while running the constructor" +
                                        (st.ok() ? std::string() : ": " + st.error_message()));
    return;
  }
  const auto& r = results.results(0);
  if (r.is_error()) {
    *reply->mutable_error() = r.error();
    std::lock_guard<std::mutex> lock(mu_);
    Worker* w = pool_.Find(worker_id);
    if (w && w->pid > 0) {
      w->kill_requested = true;
      kill(w->pid, SIGKILL);
    }
    return;
  }
  reply->set_ok(true);
}

grpc::Status Node::KillWorker(grpc::ServerContext* ctx, const rpc::KillWorkerRequest* req,
                              rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  Worker* w = pool_.Find(req->worker_id());
  if (!w || w->state == WorkerState::kDriver) return grpc::Status::OK;
  w->kill_requested = true;
  if (w->pid > 0) kill(w->pid, req->force() ? SIGKILL : SIGTERM);
  return grpc::Status::OK;
}

grpc::Status Node::GetWorkerExit(grpc::ServerContext* ctx, const rpc::WorkerExitRequest* req,
                                 rpc::WorkerExitReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  // The caller usually sees the broken connection before our reaper sees the exit: wait a bit.
  std::string description;
  int code = 0;
  auto deadline = Clock::now() + std::chrono::milliseconds(1000);
  bool exited = pool_.LookupExit(req->worker_id(), &description, &code);
  while (!exited && cv_.wait_until(lock, deadline) != std::cv_status::timeout) {
    exited = pool_.LookupExit(req->worker_id(), &description, &code);
  }
  if (!exited) exited = pool_.LookupExit(req->worker_id(), &description, &code);
  reply->set_known(exited || pool_.Known(req->worker_id()));
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
    std::lock_guard<std::mutex> lock(mu_);
    std::unique_ptr<Worker> gone = pool_.TakeExited(pid);
    if (!gone) return;
    Worker& w = *gone;
    worker_id = w.id;
    intentional = w.kill_requested;
    if (w.state == WorkerState::kStarting && !intentional) {
      TORUS_LOG(ERROR) << "worker " << w.id << " (pid " << pid << ") " << desc
                       << " before registering; see its log in " << cfg_.session_dir << "/logs";
    } else if (!intentional) {
      TORUS_LOG(WARNING) << "worker " << w.id << " (pid " << pid << ") " << desc;
    }
    if (!w.lease_id.empty()) worker_by_lease_.erase(w.lease_id);
    if (w.state == WorkerState::kActor) actor_id = w.actor_id;
    ledger_.Return(&w.hold);
    int code = 0;
    if (!w.end_reason.empty()) {
      desc = w.end_reason;
      if (desc.rfind("SliceLost", 0) == 0) code = static_cast<int>(StatusCode::kSliceLost);
    }
    pool_.RecordExit(worker_id, desc, code);
    TrySchedule();
    cv_.notify_all();
  }
  if (!actor_id.empty() && !stopping_) {
    rpc::ActorWorkerDiedRequest req;
    req.set_actor_id(actor_id);
    req.set_worker_id(worker_id);
    req.set_description("the actor's worker process " + desc);
    req.set_intentional(false);
    rpc::Empty e;
    auto ctx = NewContext(cfg_.token, 5000);
    auto st = head_->ActorWorkerDied(ctx.get(), req, &e);
    if (!st.ok()) TORUS_LOG(WARNING) << "cannot report actor death: " << st.error_message();
  }
}

void Node::ReaperLoop() {
  // waitpid() on our own workers only: an embedded node lives inside a user's driver process,
  // whose other children are none of our business.
  auto reap_once = [this] {
    std::vector<pid_t> pids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pids = pool_.Pids();
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
  while (!stopping_) {
    auto [any, pids] = reap_once();
    if (!any) reaper_waiter_.Wait(pids, 1000);
  }
  // After Stop(): reap what is left for up to 2 s, asleep until one exits.
  auto deadline = Clock::now() + std::chrono::seconds(2);
  while (true) {
    auto [any, pids] = reap_once();
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (pids.empty() || left.count() <= 0) break;
    if (!any) reaper_waiter_.Wait(pids, static_cast<int>(left.count()));
  }
}

// ------------------------------------------------------------------------------- heartbeats

std::vector<rpc::PendingDemand> Node::PendingDemands() {
  std::map<std::string, rpc::PendingDemand> by_shape;
  for (const auto& p : pending_) {
    if (p->done || p->hold.held) continue;
    std::string key = ResourcesToString(p->res) + "|" + p->req.description();
    auto& d = by_shape[key];
    if (d.count() == 0) {
      ToProto(p->res, d.mutable_resources());
      d.set_description(p->req.description());
    }
    d.set_count(d.count() + 1);
    d.set_infeasible(d.infeasible() || p->infeasible);
    const std::string& owner = p->req.owner_address();
    if (!owner.empty() && std::find(d.owner_addresses().begin(), d.owner_addresses().end(), owner) ==
                              d.owner_addresses().end()) {
      d.add_owner_addresses(owner);
    }
  }
  std::vector<rpc::PendingDemand> out;
  for (auto& [k, d] : by_shape) out.push_back(d);
  return out;
}

bool Node::FillHeartbeat(rpc::HeartbeatRequest* req) {
  if (stopping_) return false;
  req->set_node_id(cfg_.node_id);
  std::vector<pid_t> to_kill;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ToProto(ledger_.available(), req->mutable_available());
    req->set_ledger_seq(ledger_.seq());
    for (auto& d : PendingDemands()) *req->add_pending() = d;
    req->set_view_version(view_version_);
    req->set_want_view(!pending_.empty());
    // Stop idle workers beyond the CPU count once they have idled long enough.
    auto cpu = ledger_.total().find("CPU");
    int keep = static_cast<int>(cpu != ledger_.total().end() ? cpu->second : 1);
    to_kill = pool_.PickIdleToStop(keep, std::chrono::milliseconds(cfg_.idle_worker_keep_ms));
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
  if (reply.view_version() == req.view_version()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (reply.view_delta()) {
    ApplyViewDeltaLocked(reply);
  } else {
    rpc::ListReply snapshot;
    if (snapshot.ParseFromString(reply.view_snapshot())) {
      view_.assign(std::make_move_iterator(snapshot.mutable_nodes()->begin()),
                   std::make_move_iterator(snapshot.mutable_nodes()->end()));
    }
  }
  view_version_ = reply.view_version();
  TrySchedule();
}

void Node::ApplyViewDeltaLocked(const rpc::HeartbeatReply& reply) {
  // Only the nodes that changed since our version: replace, add or drop those.
  std::set<std::string> gone(reply.removed_node_ids().begin(), reply.removed_node_ids().end());
  std::map<std::string, const rpc::NodeRecord*> changed;
  for (const auto& n : reply.nodes()) changed[n.node_id()] = &n;
  std::vector<rpc::NodeRecord> next;
  next.reserve(view_.size() + changed.size());
  for (auto& n : view_) {
    if (gone.count(n.node_id())) continue;
    auto c = changed.find(n.node_id());
    if (c == changed.end()) {
      next.push_back(std::move(n));
    } else {
      next.push_back(*c->second);
      changed.erase(c);
    }
  }
  for (const auto& n : reply.nodes()) {
    if (changed.count(n.node_id())) next.push_back(n);
  }
  view_ = std::move(next);
}

void Node::GiveUp(const grpc::Status& last) {
  const bool refused = last.error_code() == grpc::StatusCode::UNAUTHENTICATED;
  TORUS_LOG(ERROR) << "node " << cfg_.node_id << ": giving up after " << cfg_.head_lost_ms
                   << " ms without a successful heartbeat: the head at " << cfg_.head_address
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
  if (req->key().empty()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "CreateObject needs a key");
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (objects_.count(req->key())) {
    return grpc::Status(grpc::StatusCode::ALREADY_EXISTS, "object key " + req->key() + " exists");
  }
  auto off = arena_alloc_->Allocate(req->size());
  if (!off) {
    reply->mutable_error()->set_code(static_cast<int>(StatusCode::kResourceExhausted));
    reply->mutable_error()->set_message(
        "the object store of node " + cfg_.node_id + " is full: " + std::to_string(req->size()) +
        " bytes needed, " + std::to_string(arena_alloc_->capacity() - arena_alloc_->used()) +
        " free of " + std::to_string(arena_alloc_->capacity()) + " (largest free range " +
        std::to_string(arena_alloc_->largest_free()) + ")");
    return grpc::Status::OK;
  }
  objects_[req->key()] = {req->object_id(), req->size(), *off, req->owner_address()};
  reply->set_offset(*off);
  return grpc::Status::OK;
}

grpc::Status Node::FreeObjects(grpc::ServerContext* ctx, const rpc::FreeObjectsRequest* req,
                               rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& key : req->keys()) {
    auto it = objects_.find(key);
    if (it == objects_.end()) continue;
    arena_alloc_->Free(it->second.offset);
    objects_.erase(it);
  }
  for (const auto& [off, size] : arena_alloc_->TakeRangesToRelease()) {
    ReleasePages(*arena_, off, size);
  }
  return grpc::Status::OK;
}

grpc::Status Node::FetchObject(grpc::ServerContext* ctx, const rpc::FetchObjectRequest* req,
                               grpc::ServerWriter<rpc::ObjectChunk>* writer) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  uint64_t offset = 0, total = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = objects_.find(req->key());
    if (it == objects_.end()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "object " + req->key() + " is not in the store of node " + cfg_.node_id);
    }
    offset = it->second.offset;
    total = it->second.size;
  }
  uint64_t chunk = req->chunk_size() ? req->chunk_size() : (4u << 20);
  chunk = std::clamp<uint64_t>(chunk, 64 << 10, 64 << 20);
  uint64_t off = 0;
  const char* base = arena_->data() + offset;
  do {
    rpc::ObjectChunk c;
    c.set_offset(off);
    c.set_total_size(total);
    uint64_t n = std::min(chunk, total - off);
    c.set_data(base + off, n);
    if (!writer->Write(c)) break;
    off += n;
  } while (off < total);
  return grpc::Status::OK;
}

grpc::Status Node::Info(grpc::ServerContext* ctx, const rpc::Empty*, rpc::NodeInfoReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  reply->set_node_id(cfg_.node_id);
  ToProto(ledger_.total(), reply->mutable_total());
  ToProto(ledger_.available(), reply->mutable_available());
  uint64_t bytes = 0;
  for (const auto& [key, o] : objects_) {
    bytes += o.size;
    auto* oi = reply->add_objects();
    oi->set_object_id(o.object_id);
    oi->set_key(key);
    oi->set_offset(o.offset);
    oi->set_size(o.size);
    oi->set_owner_address(o.owner);
    oi->set_node_id(cfg_.node_id);
  }
  reply->set_shm_bytes(bytes);
  reply->set_arena_capacity(arena_->size());
  reply->set_shm_objects(objects_.size());
  int idle = 0, n = 0;
  for (const auto& [id, w] : pool_.workers()) {
    if (w->state == WorkerState::kDriver) continue;
    ++n;
    idle += w->state == WorkerState::kIdle;
    auto* wi = reply->add_workers();
    wi->set_worker_id(id);
    wi->set_pid(w->pid);
    wi->set_address(w->address);
    static const char* kNames[] = {"starting", "idle", "leased", "actor", "driver"};
    wi->set_state(w->hold.blocked ? "blocked" : kNames[static_cast<int>(w->state)]);
    wi->set_actor_id(w->actor_id);
  }
  reply->set_num_workers(n);
  reply->set_num_idle_workers(idle);
  for (const auto& [pg, bs] : ledger_.bundles()) {
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

grpc::Status Node::LaneBundles(bool prepare, std::string_view in, std::string* out) {
  // The lane's PrepareBundles / ReleaseBundles: the same work as the service methods, with the
  // request kept per thread and the reply written straight from the ledger (a reservation of
  // 64 hosts is 128 of these calls, one per node process, on a machine with few cores).
  thread_local rpc::BundlesRequest req;
  struct Clear {
    ~Clear() { req.Clear(); }
  } clear;
  if (!req.ParseFromArray(in.data(), static_cast<int>(in.size()))) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        std::string("the ") + (prepare ? "PrepareBundles" : "ReleaseBundles") +
                            " request is not a valid message");
  }
  std::string error;
  if (prepare) {
    std::lock_guard<std::mutex> lock(mu_);
    bool ok = PrepareLocked(req, &error);
    ledger_.AppendReply(ok, error, out);
    return grpc::Status::OK;
  }
  std::vector<pid_t> to_kill;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseLocked(req, &to_kill);
    ledger_.AppendReply(true, error, out);
  }
  for (pid_t p : to_kill) kill(p, SIGKILL);
  return grpc::Status::OK;
}

grpc::Status Node::PrepareBundles(grpc::ServerContext* ctx, const rpc::BundlesRequest* req,
                                  rpc::PrepareBundlesReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  std::string error;
  bool ok = PrepareLocked(*req, &error);
  reply->set_ok(ok);
  reply->set_error(error);
  ledger_.FillReply(reply);
  return grpc::Status::OK;
}

bool Node::PrepareLocked(const rpc::BundlesRequest& req, std::string* error) {
  if (!ledger_.Prepare(req.pg_id(), Ledger::Specs(req), req.commit(), cfg_.labels, error)) return false;
  if (req.commit()) TrySchedule();
  return true;
}

grpc::Status Node::CommitBundles(grpc::ServerContext* ctx, const rpc::BundlesRequest* req,
                                 rpc::PrepareBundlesReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  reply->set_ok(true);
  ledger_.FillReply(reply);
  if (!ledger_.Commit(req->pg_id(), BundleIndices(*req))) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no prepared bundles of " + req->pg_id());
  }
  TrySchedule();
  return grpc::Status::OK;
}

grpc::Status Node::ReleaseBundles(grpc::ServerContext* ctx, const rpc::BundlesRequest* req,
                                  rpc::PrepareBundlesReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::vector<pid_t> to_kill;
  reply->set_ok(true);
  {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseLocked(*req, &to_kill);
    ledger_.FillReply(reply);
  }
  for (pid_t p : to_kill) kill(p, SIGKILL);
  return grpc::Status::OK;
}

void Node::ReleaseLocked(const rpc::BundlesRequest& req, std::vector<pid_t>* to_kill) {
  std::vector<int> released = ledger_.Release(req.pg_id(), BundleIndices(req));
  // Work running in a released bundle ends with it; its resources came back with the bundle's.
  for (int index : released) {
    for (auto& [id, w] : pool_.workers()) {
      if (w->hold.pg_id == req.pg_id() && w->hold.bundle == index) {
        w->kill_requested = true;
        w->end_reason = req.reason();
        w->hold.res.clear();
        w->hold.pg_id.clear();
        if (w->pid > 0) to_kill->push_back(w->pid);
      }
    }
  }
  // Pending leases for the removed group fail now rather than wait forever.
  if (!ledger_.HasGroup(req.pg_id())) {
    for (auto& p : pending_) {
      if (p->req.placement_group_id() == req.pg_id() && !p->done) {
        GiveBackLocked(*p, NotFound("placement group " + req.pg_id() + " was removed"));
      }
    }
  }
  TrySchedule();
  cv_.notify_all();
}

grpc::Status Node::Shutdown(grpc::ServerContext* ctx, const rpc::Empty*, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  // Stop() shuts the server down, which waits for this call: it runs on a thread of its own,
  // started once and joined by the destructor.
  shutdown_.Run([this] { Stop(); });
  return grpc::Status::OK;
}

}  // namespace torus
