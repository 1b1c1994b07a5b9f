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
// How often the lease audit runs (LeaseAuditLoop).
constexpr auto kLeaseAuditPeriod = std::chrono::milliseconds(500);

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
  if (const char* v = getenv("TORUS_LEASE_CHECK_MS"); v && *v) {
    char* end = nullptr;
    long ms = strtol(v, &end, 10);
    if (end && *end == '\0' && ms > 0) {
      lease_check_age_ = std::chrono::milliseconds(ms);
    } else {
      TORUS_LOG(WARNING) << "TORUS_LEASE_CHECK_MS='" << v << "' is not a positive number of ms; using "
                         << lease_check_age_.count();
    }
  }
}

Node::~Node() {
  Stop();
  // Stop() run by the heartbeat thread itself (giving up) could not join that thread.
  if (heartbeat_thread_.joinable()) heartbeat_thread_.join();
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
  TORUS_LOG(INFO) << "node " << cfg_.node_id << " listening on " << address_ << " resources "
                  << ResourcesToString(ledger_.total());
  heartbeat_thread_ = std::thread([this] { HeartbeatLoop(); });
  reaper_thread_ = std::thread([this] { ReaperLoop(); });
  lease_audit_thread_ = std::thread([this] { LeaseAuditLoop(); });
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
  head_heartbeat_ms_ = reply.heartbeat_ms();
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
    for (auto& [id, w] : workers_) {
      if (w->pid > 0 && w->state != WorkerState::kDriver) {
        w->kill_requested = true;
        pids.push_back(w->pid);
      }
    }
    objects_.clear();
    for (auto& p : pending_) {
      if (!p->done) GiveBackLocked(*p, Unavailable("node " + cfg_.node_id + " is shutting down"));
    }
    cv_.notify_all();
  }
  for (pid_t p : pids) kill(p, SIGTERM);
  auto deadline = Clock::now() + std::chrono::milliseconds(1500);
  for (pid_t p : pids) {
    while (Clock::now() < deadline) {
      if (kill(p, 0) != 0) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(p, SIGKILL);
  }
  UnlinkSegmentsWithPrefix(shm_prefix_);
  shm_lock_.Release();
  if (head_) {
    rpc::UnregisterNodeRequest req;
    req.set_node_id(cfg_.node_id);
    rpc::Empty e;
    auto ctx = NewContext(cfg_.token, 1000);
    (void)head_->UnregisterNode(ctx.get(), req, &e);
  }
  {
    std::lock_guard<std::mutex> lock(stop_mu_);  // a beat waiting on beat_cv_ sees stopping_
  }
  beat_cv_.notify_all();
  reaper_waiter_.Wake();
  if (heartbeat_thread_.joinable() && heartbeat_thread_.get_id() != std::this_thread::get_id()) {
    heartbeat_thread_.join();
  }
  if (reaper_thread_.joinable()) reaper_thread_.join();
  if (lease_audit_thread_.joinable()) lease_audit_thread_.join();
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
  auto it = workers_.find(req->worker_id());
  if (req->is_driver()) {
    auto w = std::make_unique<Worker>();
    w->id = req->worker_id();
    w->pid = req->pid();
    w->address = req->address();
    w->state = WorkerState::kDriver;
    workers_[w->id] = std::move(w);
  } else if (it == workers_.end()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        "worker " + req->worker_id() + " was not started by this node");
  } else {
    Worker& w = *it->second;
    w.address = req->address();
    if (w.state == WorkerState::kStarting) {
      w.state = WorkerState::kIdle;
      w.idle_since = Clock::now();
      if (w.reserved_for.empty() && --starting_by_key_[w.runtime_key] <= 0) {
        starting_by_key_.erase(w.runtime_key);
      }
    }
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

std::string Node::ChipKey(const std::string& key, const std::vector<int>& chips) {
  if (chips.empty()) return key;
  std::string k = key + "|tpu=";
  for (int c : chips) k += std::to_string(c) + ",";
  return k;
}

Status Node::StartWorker(const std::string& key, const std::string& exe,
                         const std::vector<std::string>& code_path, const std::vector<int>& chips,
                         const std::string& reserved_for, std::string* id_out,
                         const Ledger::Bundle* bundle,
                         const google::protobuf::Map<std::string, std::string>* env_vars) {
  auto w = std::make_unique<Worker>();
  w->id = RandomHex(14);
  w->runtime_key = key;
  w->reserved_for = reserved_for;
  if (id_out) *id_out = w->id;
  SpawnOptions opts;
  std::string code;
  for (const auto& p : code_path) code += (code.empty() ? "" : ":") + p;
  if (code_path.empty()) {
    opts.argv = {exe};
  } else {
    opts.argv = {cfg_.torus_exe, "worker"};
    opts.env_set["TORUS_CODE_SEARCH_PATH"] = code;
  }
  opts.env_set["TORUS_WORKER_MODE"] = "1";
  opts.env_set["TORUS_NODE_ADDRESS"] = address_;
  opts.env_set["TORUS_BIND_HOST"] = cfg_.bind_host;  // workers listen where their node does
  opts.env_set["TORUS_NODE_ID"] = cfg_.node_id;
  opts.env_set["TORUS_WORKER_ID"] = w->id;
  opts.env_set["TORUS_TOKEN"] = cfg_.token;
  opts.env_set["TORUS_SESSION_DIR"] = cfg_.session_dir;
  opts.env_set["TORUS_HEAD_ADDRESS"] = cfg_.head_address;
  opts.env_unset = {"TORUS_ADDRESS", "RAY_ADDRESS"};
  if (!chips.empty()) {
    // docs/tpu.md section 7: which chips this worker may use.
    std::map<std::string, std::string> env;
    for (char** e = environ; *e; ++e) {
      const char* eq = strchr(*e, '=');
      if (eq) env[std::string(*e, eq - *e)] = eq + 1;
    }
    auto changes = tpu::ComputeChipVisibility(static_cast<int>(tpu_chip_ids_.size()), chips,
                                              tpu::VisibilityOptOut(env));
    for (const auto& [k, v] : changes.set) opts.env_set[k] = v;
    for (const auto& k : changes.unset) opts.env_unset.push_back(k);
  }
  if (bundle) {
    // A slice reservation's bundle: MEGASCALE_* always overwrite inherited values (section 7).
    for (const auto& [k, v] : bundle->env) opts.env_set[k] = v;
    for (const auto& k : bundle->env_unset) {
      opts.env_set.erase(k);
      opts.env_unset.push_back(k);
    }
  }
  if (env_vars) {
    // runtime_env env_vars (part of `key`); the runtime's own variables above take precedence.
    for (const auto& [k, v] : *env_vars) opts.env_set.emplace(k, v);
  }
  std::string logs = cfg_.logs_dir.empty() ? cfg_.session_dir + "/logs" : cfg_.logs_dir;
  std::string log = logs + "/worker-" + w->id.substr(0, 12);
  opts.stdout_path = log + ".out";
  opts.stderr_path = log + ".err";
  auto pid = Spawn(opts);
  if (!pid.ok()) return pid.status();
  w->pid = *pid;
  worker_by_pid_[w->pid] = w->id;
  reaper_waiter_.Wake();
  if (reserved_for.empty()) starting_by_key_[key]++;
  TORUS_LOG(DEBUG) << "started worker " << w->id << " pid " << w->pid;
  workers_[w->id] = std::move(w);
  return Status::Ok();
}

Node::Worker* Node::FindIdleWorker(const std::string& key) {
  Worker* best = nullptr;
  for (auto& [id, w] : workers_) {
    if (w->state == WorkerState::kIdle && w->runtime_key == key && !w->kill_requested &&
        w->reserved_for.empty()) {
      if (!best || w->idle_since > best->idle_since) best = w.get();  // most recently used
    }
  }
  return best;
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

void Node::TrySchedule() {
  bool any_done = false;
  std::map<std::string, int> need_workers;
  std::map<std::string, const rpc::LeaseRequest*> example;
  std::map<std::string, std::vector<int>> chips_of;
  std::map<std::string, const Ledger::Bundle*> bundle_of;
  auto lease_key = [this](const PendingLease& p) {
    std::string k = ChipKey(Key(p.req), p.hold.chips);
    return p.hold.bundle >= 0 ? ledger_.BundleEnvKey(k, p.hold.pg_id, p.hold.bundle) : k;
  };
  for (auto it = pending_.begin(); it != pending_.end();) {
    PendingLease& p = **it;
    if (p.done) {
      it = pending_.erase(it);
      continue;
    }
    if (!p.hold.held && !p.req.placement_group_id().empty()) {
      std::string error;
      if (!TakeFromBundle(p, &error)) {
        if (error.empty()) {
          ++it;
          continue;
        }
        GiveBackLocked(p, NotFound(error));
        any_done = true;
        it = pending_.erase(it);
        continue;
      }
    }
    if (!p.hold.held) {
      if (MatchesLabels(p.selector, cfg_.labels) && ledger_.TakeFromNode(p.res, &p.hold)) {
        p.infeasible = false;
      } else {
        if (TrySpillback(p)) {
          any_done = true;
          it = pending_.erase(it);
          continue;
        }
        if (!AnyNodeCouldFit(p.res, p.selector)) {
          if (!p.infeasible) {
            TORUS_LOG(WARNING) << "infeasible request " << ResourcesToString(p.res) << " for "
                               << p.req.description()
                               << ": no node of the cluster has these resources"
                               << (p.selector.empty() ? "" : " and matching labels")
                               << "; it stays pending until such a node joins";
          }
          p.infeasible = true;
        }
        ++it;
        continue;
      }
    }
    std::string wkey = lease_key(p);
    Worker* w = FindIdleWorker(wkey);
    if (!w) {
      need_workers[wkey]++;
      example[wkey] = &p.req;
      chips_of[wkey] = p.hold.chips;
      if (p.hold.bundle >= 0) bundle_of[wkey] = ledger_.FindBundle(p.hold.pg_id, p.hold.bundle);
      ++it;
      continue;
    }
    w->state = WorkerState::kLeased;
    w->lease_id = RandomHex(8);
    w->leased_at = Clock::now();
    w->lease_in_use = false;
    w->hold = std::move(p.hold);  // the worker holds the resources now
    p.hold = Hold{};
    worker_by_lease_[w->lease_id] = w->id;
    p.reply.set_granted(true);
    p.reply.set_lease_id(w->lease_id);
    p.reply.set_worker_id(w->id);
    p.reply.set_worker_address(w->address);
    p.reply.set_node_id(cfg_.node_id);
    p.done = true;
    any_done = true;
    it = pending_.erase(it);
  }
  for (const auto& [key, n] : need_workers) {
    int starting = starting_by_key_.count(key) ? starting_by_key_[key] : 0;
    for (int i = starting; i < n; ++i) {
      const auto* r = example[key];
      std::vector<std::string> code(r->code_search_path().begin(), r->code_search_path().end());
      if (auto s = StartWorker(key, r->executable(), code, chips_of[key], "", nullptr, bundle_of[key],
                               &r->env_vars());
          !s.ok()) {
        TORUS_LOG(ERROR) << "cannot start worker: " << s.ToString();
        for (auto& p : pending_) {
          if (lease_key(*p) == key && !p->done) {
            GiveBackLocked(*p, Internal(s.message()));
            any_done = true;
          }
        }
        break;
      }
    }
  }
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
  auto wit = workers_.find(it->second);
  worker_by_lease_.erase(it);
  if (wit == workers_.end()) return false;
  Worker& w = *wit->second;
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

void Node::LeaseAuditLoop() {
  while (!stopping_) {
    {
      std::unique_lock<std::mutex> lock(stop_mu_);
      beat_cv_.wait_for(lock, kLeaseAuditPeriod, [this] { return stopping_.load(); });
    }
    if (stopping_) break;
    AuditLeases();
  }
}

void Node::AuditLeases() {
  struct Question {
    std::string worker_id, address, lease_id;
  };
  std::vector<Question> questions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto now = Clock::now();
    for (auto& [id, w] : workers_) {
      if (w->state == WorkerState::kLeased && !w->lease_in_use && !w->address.empty() &&
          now - w->leased_at >= lease_check_age_) {
        questions.push_back({id, w->address, w->lease_id});
      }
    }
    // Queued requests that have waited may spill again (TrySpillback), and only time tells.
    if (!pending_.empty()) TrySchedule();
  }
  for (const auto& q : questions) {
    rpc::CheckLeaseRequest req;
    req.set_lease_id(q.lease_id);
    rpc::CheckLeaseReply reply;
    auto ctx = NewContext(cfg_.token, 1000);
    auto st = rpc::CoreWorker::NewStub(GetChannel(q.address))->CheckLease(ctx.get(), req, &reply);
    if (!st.ok()) continue;  // a dead worker is the reaper's; a busy one is asked again
    std::lock_guard<std::mutex> lock(mu_);
    auto wit = workers_.find(q.worker_id);
    if (wit == workers_.end() || wit->second->lease_id != q.lease_id) continue;
    if (reply.use() == rpc::CheckLeaseReply::IN_USE) {
      wit->second->lease_in_use = true;
    } else if (reply.use() == rpc::CheckLeaseReply::REVOKED) {
      TORUS_LOG(WARNING) << "took back lease " << q.lease_id << " of worker " << q.worker_id
                         << ": its holder never used it within " << lease_check_age_.count()
                         << " ms (the grant's reply was lost)";
      EndLeaseLocked(q.lease_id, false);
      TrySchedule();
    }
  }
}

grpc::Status Node::NotifyBlocked(grpc::ServerContext* ctx, const rpc::BlockedRequest* req,
                                 rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(req->worker_id());
  if (it == workers_.end()) return grpc::Status::OK;
  Worker& w = *it->second;
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
  std::string key = req->code_search_path_size() ? "code:" : "exe:";
  key += req->executable();
  for (const auto& p : req->code_search_path()) key += ":" + p;
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
    key = ChipKey(key, hold.chips);
    if (hold.bundle >= 0) key = ledger_.BundleEnvKey(key, hold.pg_id, hold.bundle);
    auto give_back = [&] { ledger_.Return(&hold); };
    Worker* w = FindIdleWorker(key);
    if (!w) {
      // A worker started for this actor alone: task leases never take it meanwhile.
      std::vector<std::string> code(req->code_search_path().begin(), req->code_search_path().end());
      std::string started;
      if (auto s = StartWorker(key, req->executable(), code, hold.chips, req->creation().actor_id(), &started,
                               hold.bundle >= 0 ? ledger_.FindBundle(hold.pg_id, hold.bundle) : nullptr,
                               &req->creation().env_vars());
          !s.ok()) {
        give_back();
        reply->mutable_error()->set_code(static_cast<int>(StatusCode::kInternal));
        reply->mutable_error()->set_message(s.message());
        return grpc::Status::OK;
      }
      auto deadline = Clock::now() + std::chrono::seconds(60);
      while (true) {
        auto it = workers_.find(started);
        std::string why;
        if (it == workers_.end() || it->second->pid <= 0) {
          why = "the actor's worker process exited before it registered (see its log)";
        } else if (it->second->state == WorkerState::kIdle) {
          w = it->second.get();
          w->reserved_for.clear();
          break;
        } else if (stopping_ || cv_.wait_until(lock, deadline) == std::cv_status::timeout) {
          why = "actor worker did not start within 60 s";
        }
        if (!why.empty()) {
          give_back();
          reply->mutable_error()->set_code(static_cast<int>(StatusCode::kUnavailable));
          reply->mutable_error()->set_message(why);
          return grpc::Status::OK;
        }
      }
    }
    w->state = WorkerState::kActor;
    w->actor_id = req->creation().actor_id();
    w->hold = std::move(hold);
    worker_id = w->id;
    worker_address = w->address;
  }
  // Run the constructor on the dedicated worker.
  auto stub = rpc::CoreWorker::NewStub(GetChannel(worker_address));
  auto cctx = NewContext(cfg_.token);
  auto stream = stub->PushTasks(cctx.get());
  rpc::TaskBatch batch;
  *batch.add_tasks() = req->creation();
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
    return grpc::Status::OK;
  }
  const auto& r = results.results(0);
  if (r.is_error()) {
    *reply->mutable_error() = r.error();
    std::lock_guard<std::mutex> lock(mu_);
    auto it = workers_.find(worker_id);
    if (it != workers_.end() && it->second->pid > 0) {
      it->second->kill_requested = true;
      kill(it->second->pid, SIGKILL);
    }
    return grpc::Status::OK;
  }
  reply->set_ok(true);
  return grpc::Status::OK;
}

grpc::Status Node::KillWorker(grpc::ServerContext* ctx, const rpc::KillWorkerRequest* req,
                              rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = workers_.find(req->worker_id());
  if (it == workers_.end() || it->second->state == WorkerState::kDriver) return grpc::Status::OK;
  it->second->kill_requested = true;
  if (it->second->pid > 0) kill(it->second->pid, req->force() ? SIGKILL : SIGTERM);
  return grpc::Status::OK;
}

grpc::Status Node::GetWorkerExit(grpc::ServerContext* ctx, const rpc::WorkerExitRequest* req,
                                 rpc::WorkerExitReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::unique_lock<std::mutex> lock(mu_);
  // The caller usually sees the broken connection before our reaper sees the exit: wait a bit.
  cv_.wait_for(lock, std::chrono::milliseconds(1000),
               [&] { return exits_.count(req->worker_id()) > 0; });
  auto it = exits_.find(req->worker_id());
  reply->set_known(it != exits_.end() || workers_.count(req->worker_id()));
  if (it != exits_.end()) {
    reply->set_exited(true);
    reply->set_description(it->second);
    auto c = exit_codes_.find(req->worker_id());
    if (c != exit_codes_.end()) reply->set_code(c->second);
  }
  return grpc::Status::OK;
}

void Node::HandleWorkerExit(pid_t pid, int status) {
  std::string desc = DescribeWaitStatus(status);
  std::string actor_id, worker_id;
  bool intentional = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto pit = worker_by_pid_.find(pid);
    if (pit == worker_by_pid_.end()) return;
    worker_id = pit->second;
    worker_by_pid_.erase(pit);
    auto it = workers_.find(worker_id);
    if (it == workers_.end()) return;
    Worker& w = *it->second;
    intentional = w.kill_requested;
    if (w.state == WorkerState::kStarting && w.reserved_for.empty()) {
      if (--starting_by_key_[w.runtime_key] <= 0) starting_by_key_.erase(w.runtime_key);
    }
    if (w.state == WorkerState::kStarting && !intentional) {
      TORUS_LOG(ERROR) << "worker " << w.id << " (pid " << pid << ") " << desc
                       << " before registering; see its log in " << cfg_.session_dir << "/logs";
    } else if (!intentional) {
      TORUS_LOG(WARNING) << "worker " << w.id << " (pid " << pid << ") " << desc;
    }
    if (!w.lease_id.empty()) worker_by_lease_.erase(w.lease_id);
    if (w.state == WorkerState::kActor) actor_id = w.actor_id;
    ledger_.Return(&w.hold);
    if (!w.end_reason.empty()) {
      desc = w.end_reason;
      if (desc.rfind("SliceLost", 0) == 0) exit_codes_[worker_id] = static_cast<int>(StatusCode::kSliceLost);
    }
    workers_.erase(it);
    exits_[worker_id] = desc;
    exit_order_.push_back(worker_id);
    while (exit_order_.size() > 10000) {
      exit_codes_.erase(exit_order_.front());
      exits_.erase(exit_order_.front());
      exit_order_.pop_front();
    }
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
      for (const auto& [pid, id] : worker_by_pid_) pids.push_back(pid);
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
  auto deadline = Clock::now() + std::chrono::seconds(2);
  while (Clock::now() < deadline && !reap_once().second.empty()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
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

void Node::HeartbeatLoop() {
  int failures = 0;
  auto last_ok = Clock::now();
  while (!stopping_) {
    int period_ms = std::max<int>(cfg_.heartbeat_ms, static_cast<int>(head_heartbeat_ms_.load()));
    rpc::HeartbeatRequest req;
    req.set_node_id(cfg_.node_id);
    req.set_heartbeat_ms(static_cast<uint32_t>(period_ms));
    std::vector<pid_t> to_kill;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ToProto(ledger_.available(), req.mutable_available());
      req.set_ledger_seq(ledger_.seq());
      for (auto& d : PendingDemands()) *req.add_pending() = d;
      req.set_view_version(view_version_);
      req.set_want_view(!pending_.empty());
      // Stop idle workers beyond the CPU count once they have idled long enough.
      int idle = 0;
      for (auto& [id, w] : workers_) idle += w->state == WorkerState::kIdle;
      auto cpu = ledger_.total().find("CPU");
      int keep = static_cast<int>(cpu != ledger_.total().end() ? cpu->second : 1);
      auto now = Clock::now();
      for (auto& [id, w] : workers_) {
        if (idle <= keep) break;
        if (w->state == WorkerState::kIdle && !w->kill_requested &&
            now - w->idle_since > std::chrono::milliseconds(cfg_.idle_worker_keep_ms)) {
          w->kill_requested = true;
          to_kill.push_back(w->pid);
          --idle;
        }
      }
    }
    for (pid_t p : to_kill) kill(p, SIGTERM);
    rpc::HeartbeatReply reply;
    // Over the head's lane when it has one: a gRPC heartbeat cost the two processes together
    // several times the CPU, and 64 nodes send 640 a second.
    auto st = LaneUnary(cfg_.head_address, cfg_.token, 2000, "/torus.rpc.Head/Heartbeat",
                        &rpc::Head::Service::Heartbeat, &rpc::Head::Stub::Heartbeat, req, &reply);
    if (!st.ok()) {
      if (++failures % 50 == 1) {
        TORUS_LOG(WARNING) << "heartbeat to head " << cfg_.head_address
                           << " failed: " << st.error_message();
      }
      if (Clock::now() - last_ok >= std::chrono::milliseconds(cfg_.head_lost_ms)) {
        GiveUp(st);
        return;
      }
    } else {
      failures = 0;
      last_ok = Clock::now();
      head_heartbeat_ms_ = reply.heartbeat_ms();
      if (reply.unknown_node()) {
        TORUS_LOG(WARNING) << "head does not know this node; registering again";
        (void)RegisterWithHead();
      } else if (reply.view_version() != req.view_version()) {
        std::lock_guard<std::mutex> lock(mu_);
        if (reply.view_delta()) {
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
    }
    period_ms = std::max<int>(cfg_.heartbeat_ms, static_cast<int>(head_heartbeat_ms_.load()));
    // One timed wait, not 10 ms naps: an idle node should not wake 100 times a second.
    std::unique_lock<std::mutex> lock(stop_mu_);
    beat_cv_.wait_for(lock, std::chrono::milliseconds(period_ms), [this] { return stopping_.load(); });
  }
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
  for (const auto& [id, w] : workers_) {
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
    for (auto& [id, w] : workers_) {
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
  std::thread([this] { Stop(); }).detach();
  return grpc::Status::OK;
}

}  // namespace torus
