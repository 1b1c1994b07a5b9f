#include "head/head.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <set>

#include "common/wall_clock.h"
#include "common/ids.h"
#include "common/head_addresses.h"
#include "common/lane.h"
#include "common/logging.h"
#include "head/dashboard_http.h"
#include "head/jobs_http.h"
#include "head/serve_http.h"
#include "head/slice_idle.h"
#include "head/slices.h"
#include "tpu/topology.h"
#include "common/rpc.h"
#include "common/session.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;

// What a node registers must hold to the rules `torus start` applies, so that a hand-made
// RegisterNode cannot inject negative or absurd capacities.
Status ValidateNodeRecord(const rpc::NodeRecord& n) {
  if (auto s = ValidateResourceSet(n.total(), "node " + n.node_id() + " resources"); !s.ok()) {
    return s;
  }
  std::map<std::string, std::string> labels(n.labels().begin(), n.labels().end());
  return ValidateRegisteredLabels(labels, n.node_id(), n.hostname());
}

}  // namespace

Head::Head(HeadConfig cfg)
    : cfg_(std::move(cfg)),
      pg_manager_(mu_, *this, work_, cfg_.token, std::chrono::milliseconds(cfg_.stray_bundle_grace_ms)),
      actors_(mu_, *this, pg_manager_, work_, cfg_.token, stopping_) {}

Head::~Head() {
  Stop();
  shutdown_.Join();
  // Destroying the server joins its RPC threads, so no handler still reads a part (actor
  // directory, placement groups) that the member destructors below tear down.
  server_.reset();
}

Status Head::Start() {
  if (auto s = ValidateToken(cfg_.token, "the head's configuration"); !s.ok()) return s;
  int port = cfg_.port;
  started_at_ = std::chrono::steady_clock::now();
  if (!cfg_.state_path.empty() || cfg_.store) {
    if (auto s = RestoreState(); !s.ok()) return s;
  }
  job_manager_ = std::make_unique<JobManager>(JobManagerConfig{cfg_.token, cfg_.session_dir, store_.get()});
  lane_ = std::make_unique<LaneServer>(cfg_.token, "head");
  lane_->Handle("/torus.rpc.Head/CreatePlacementGroup", this, &rpc::Head::Service::CreatePlacementGroup);
  lane_->Handle("/torus.rpc.Head/RemovePlacementGroup", this, &rpc::Head::Service::RemovePlacementGroup);
  lane_->Handle("/torus.rpc.Head/GetPlacementGroup", this, &rpc::Head::Service::GetPlacementGroup);
  lane_->Handle("/torus.rpc.Head/Heartbeat", this, &rpc::Head::Service::Heartbeat);
  // Both of its ports listen on listen_host when set (a caller that dialled 127.0.0.1 also
  // reaches the lane there).
  const std::string& listen = cfg_.ListenHost();
  if (lane_->Start(listen) == 0) {
    TORUS_LOG(WARNING) << "head: no lane port on " << listen << "; placement-group calls use gRPC";
  }
  std::string why;
  server_ = StartServer(listen, &port, {this, job_manager_.get(), lane_.get()}, 0, &why);
  if (server_ && lane_) lane_->SetGrpcPort(port);
  if (!server_ || port == 0) {
    lane_->Stop();
    return Unavailable("head cannot listen on " + listen + ":" + std::to_string(cfg_.port) + ": " + why);
  }
  address_ = cfg_.bind_host + ":" + std::to_string(port);
  RegisterInProcessServer(address_, server_.get(), this);
  job_manager_->SetHeadAddress(address_);
  if (auto jobs = job_manager_->Restore(); !jobs.ok()) {
    Stop();
    return jobs.status();
  } else {
    resumed_.jobs = *jobs;
  }
  job_manager_->AcceptSubmissions();
  if (auto s = StartHttp(); !s.ok()) {
    Stop();
    return s;
  }
  TORUS_LOG(INFO) << "head listening on " << address_ << ", session " << cfg_.session_dir;
  monitor_.Start(kMonitorPeriod, [this] { return MonitorTick(); });
  pg_manager_.Start();
  return Status::Ok();
}

Status Head::StartHttp() {
  if (cfg_.dashboard_port < 0) return Status::Ok();
  HttpServer::Options o;
  o.name = "dashboard";
  o.host = cfg_.dashboard_host;
  o.port = cfg_.dashboard_port;
  o.any_port_if_taken = cfg_.dashboard_port_fallback;
  o.threads = 8;  // handlers only: connections and log tails hold no pool thread
  o.token = cfg_.token;
  http_ = std::make_unique<HttpServer>(o);
  // KubeRay's readiness probe of the head (Ray's answer: 200 "success").
  http_->Handle("GET", "/api/gcs_healthz", HttpServer::Access::kPublic, [this](const HttpRequest&) {
    return stopping_ ? HttpResponse::Text("503: Health check failed: the head is stopping", 503)
                     : HttpResponse::Text("success");
  }, HttpServer::Lane::kProbe);
  const char* serve_python = std::getenv("TORUS_SERVE_PYTHON");
  serve_ = std::make_unique<ServeApi>(kv_, MakeHeadServeRuntime(actors_, *job_manager_, stopping_),
                                      ServeBootstrapCommand(serve_python ? serve_python : ""));
  // The head's metrics, then Serve's (its controller's text in KV, filtered: serve_metrics.h).
  ServeMetrics(*http_, [this] { return CollectMetrics(); }, [this] { return serve_->Metrics(); });
  RegisterDashboardHttp(*http_, {address_, cfg_.token});
  RegisterJobsHttp(*http_, *job_manager_,
                   {std::filesystem::path(cfg_.session_dir).filename().string()});
  RegisterServeHttp(*http_, *serve_);
  if (auto s = http_->Start(); !s.ok()) {
    http_.reset();
    return s;
  }
  return Status::Ok();
}

void Head::Wait() {
  MutexLock lock(stop_mu_);
  while (!stopped_) stopped_cv_.Wait(lock);
}

void Head::Stop() {
  if (stopping_.exchange(true)) {
    Wait();
    return;
  }
  if (http_) http_->Stop();  // its handlers call the job manager
  if (job_manager_) job_manager_->Stop();  // first: it still talks to our own service
  {
    MutexLock lock(mu_);
    stop_cv_.NotifyAll();
  }
  actors_.Stop();  // wakes GetActor waiters, cancels the StartActor calls in flight
  pg_manager_.Stop();
  monitor_.Stop();
  work_.Stop();  // placements (cancelled above), kills and releases finish here
  UnregisterInProcessServer(address_);
  if (lane_) lane_->Stop();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  MutexLock lock(stop_mu_);
  stopped_ = true;
  stopped_cv_.NotifyAll();
}

// ------------------------------------------------------------------------------- nodes

grpc::Status Head::RegisterNode(grpc::ServerContext* ctx, const rpc::RegisterNodeRequest* req,
                                rpc::RegisterNodeReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  const auto& n = req->node();
  if (n.node_id().empty() || n.address().empty()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument,
             "node registration needs a node id and an address");
    return grpc::Status::OK;
  }
  if (auto s = ValidateNodeRecord(n); !s.ok()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, s.message());
    return grpc::Status::OK;
  }
  MutexLock lock(mu_);
  auto [it, fresh] = nodes_.try_emplace(n.node_id());
  auto& e = it->second;
  // The bundles it lists are older than a ledger of this same process the head has applied (a
  // registration repeated after its reply was lost, overtaken by a grant): not evidence of loss.
  const bool held_is_stale = !fresh && e.address == n.address() && e.pid == n.pid() &&
                             req->ledger_seq() < e.ledger_seq;
  placement_index_.Remove(e);  // its labels and totals may change: indexed again below
  SetFromRecord(names_, n, &e);
  e.known = true;
  e.ledger_seq = 0;
  e.pending.reset();
  const bool was_alive = e.alive;
  if (!e.alive) ++alive_nodes_;
  e.alive = true;
  e.start_time_ms = WallClockMs();
  e.last_heartbeat = Clock::now();
  IndexNodeLocked(it->first, e);
  BumpView(&it->first);
  NoteLane(n.address(), static_cast<int>(req->lane_port()), req->lane_unix());
  reply->set_session_dir(cfg_.session_dir);
  e.beat_ms = PacedHeartbeatMsLocked();
  reply->set_heartbeat_ms(e.beat_ms);
  uint64_t heads_version = 0;
  FillHeads(0, reply->mutable_head_addresses(), &heads_version);
  reply->set_heads_version(heads_version);
  *reply->mutable_watch() = WatchTargetLocked(it);
  if (fresh || !was_alive) PushWatchLocked(it, /*join=*/true);  // its watcher watches it from now on
  TORUS_LOG(INFO) << (fresh ? "node registered: " : "node re-registered: ") << n.node_id() << " at "
                  << n.address() << " " << ResourcesToString(FromProto(n.total()));
  pg_manager_.AssertHeld();  // it shares mu_
  pg_manager_.ReconcileNodeLocked(n.node_id(), n.address(), req->held(), held_is_stale);
  actors_.AssertHeld();  // it shares mu_
  actors_.ScheduleLocked();
  return grpc::Status::OK;
}

grpc::Status Head::UnregisterNode(grpc::ServerContext* ctx, const rpc::UnregisterNodeRequest* req,
                                  rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  auto it = nodes_.find(req->node_id());
  if (it == nodes_.end()) return grpc::Status::OK;
  const bool was_alive = it->second.alive;
  if (was_alive) {
    --alive_nodes_;
    dead_order_.push_back(it->first);
  }
  it->second.alive = false;
  IndexNodeLocked(it->first, it->second);
  BumpView(&it->first);
  TORUS_LOG(INFO) << "node left: " << req->node_id();
  if (was_alive) PushWatchLocked(it, /*join=*/false);  // its watcher watches the next one now
  pg_manager_.AssertHeld();  // it shares mu_
  pg_manager_.OnNodeLost(req->node_id());
  actors_.AssertHeld();  // it shares mu_
  actors_.OnNodeGoneLocked(req->node_id(), "its node " + req->node_id() + " stopped", /*pending_too=*/true);
  return grpc::Status::OK;
}

grpc::Status Head::Heartbeat(grpc::ServerContext* ctx, const rpc::HeartbeatRequest* req,
                             rpc::HeartbeatReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  auto it = nodes_.find(req->node_id());
  if (it == nodes_.end() || !it->second.alive) {
    reply->set_unknown_node(true);
    return grpc::Status::OK;
  }
  auto& e = it->second;
  e.last_heartbeat = Clock::now();
  uint32_t paced = PacedHeartbeatMsLocked();
  reply->set_heartbeat_ms(paced);
  e.beat_ms = std::max(paced, req->heartbeat_ms());
  e.reported_beat_ms = req->heartbeat_ms();
  // A heartbeat older than a bundle reply we already applied would undo that reply.
  bool changed = req->ledger_seq() >= e.ledger_seq && !SameResources(names_, e.Available(), req->available());
  if (changed) {
    SetAvailable(names_, req->available(), &e);
    e.ledger_seq = req->ledger_seq();
    IndexNodeLocked(it->first, e);
    BumpView(&it->first);
  }
  if (req->pending_size() > 0) {
    if (!e.pending) e.pending = std::make_unique<std::vector<rpc::PendingDemand>>();
    e.pending->assign(req->pending().begin(), req->pending().end());
  } else {
    e.pending.reset();
  }
  if (req->want_view() || alive_nodes_ <= static_cast<size_t>(cfg_.push_view_max_nodes)) {
    FillViewLocked(req->view_version(), reply);
  } else {
    reply->set_view_version(req->view_version());  // nothing shipped: the node keeps its view
  }
  if (changed) {
    actors_.AssertHeld();  // it shares mu_
    actors_.ScheduleLocked();
    pg_manager_.AssertHeld();  // it shares mu_
    pg_manager_.Wake();
  }
  uint64_t heads_version = req->heads_version();
  FillHeads(heads_version, reply->mutable_head_addresses(), &heads_version);
  reply->set_heads_version(heads_version);
  finished_jobs_.Fill(*req, reply);
  // The node's target, built only when it is not the one the node watches (the usual case).
  const auto next = NextAliveLocked(it);
  if (next == nodes_.end() ? !req->watching().empty() : next->first != req->watching()) {
    *reply->mutable_watch() = WatchTargetLocked(it);
  }
  return grpc::Status::OK;
}

void Head::SetHeadAddresses(std::vector<std::string> heads) {
  MutexLock lock(heads_mu_);
  heads_version_ = heads.empty() ? 0 : HeadAddresses::VersionOf(heads);
  heads_ = std::move(heads);
}

void Head::FillHeads(uint64_t known, google::protobuf::RepeatedPtrField<std::string>* out, uint64_t* version) const {
  MutexLock lock(heads_mu_);
  *version = heads_version_;
  if (heads_version_ == known) return;
  for (const auto& h : heads_) out->Add()->assign(h);
}

std::optional<std::chrono::milliseconds> Head::MonitorTick() {
  MutexLock lock(mu_);
  if (stopping_) return std::nullopt;
  auto now = Clock::now();
  // A head that did not run for a while (starved, stopped, swapped out) cannot tell a silent
  // node from its own absence: that gap does not count against any node.
  if (last_monitor_ != Clock::time_point{} && now - last_monitor_ > std::chrono::seconds(1)) {
    auto gap = now - last_monitor_;
    TORUS_LOG(WARNING) << "node monitor did not run for "
                       << std::chrono::duration_cast<std::chrono::milliseconds>(gap).count()
                       << " ms; heartbeat deadlines moved by that much";
    for (auto& [id, n] : nodes_) n.last_heartbeat += gap;
  }
  last_monitor_ = now;
  for (auto& [id, n] : nodes_) {
    if (!n.alive) continue;
    int64_t timeout_ms = std::max<int64_t>(cfg_.node_timeout_ms,
                                           int64_t{kMissedHeartbeats} * n.beat_ms);
    if (now - n.last_heartbeat > std::chrono::milliseconds(timeout_ms)) {
      DeclareDeadLocked(id, n, "missed heartbeats for " + std::to_string(timeout_ms) + " ms");
    }
  }
  if (now >= resume_until_) EndResumeGraceLocked();
  pg_manager_.AssertHeld();  // it shares mu_
  pg_manager_.ReleaseStrayBundlesLocked(now);
  ForgetDeadNodesLocked();
  actors_.AssertHeld();  // it shares mu_
  actors_.ScheduleLocked();
  return kMonitorPeriod;
}

void Head::DeclareDeadLocked(const std::string& id, NodeEntry& n, const std::string& why) {
  n.alive = false;
  --alive_nodes_;
  dead_order_.push_back(id);
  IndexNodeLocked(id, n);
  BumpView(&id);
  TORUS_LOG(WARNING) << "node " << id << " declared dead: " << why;
  actors_.AssertHeld();  // it shares mu_
  actors_.OnNodeGoneLocked(id, "its node " + id + " died", /*pending_too=*/false);
  pg_manager_.AssertHeld();  // it shares mu_
  pg_manager_.OnNodeLost(id);
  PushWatchLocked(nodes_.find(id), /*join=*/false);  // its watcher watches the next one now
}

// ------------------------------------------------------------------------------- actors

grpc::Status Head::CreateActor(grpc::ServerContext* ctx, const rpc::CreateActorRequest* req,
                               rpc::CreateActorReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  actors_.Create(*req, reply);
  return grpc::Status::OK;
}

grpc::Status Head::ActorStarted(grpc::ServerContext* ctx, const rpc::ActorStartedRequest*,
                                rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return grpc::Status::OK;  // placement reports through StartActor's reply
}

grpc::Status Head::ActorWorkerDied(grpc::ServerContext* ctx, const rpc::ActorWorkerDiedRequest* req,
                                   rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  actors_.WorkerDied(*req);
  return grpc::Status::OK;
}

grpc::Status Head::GetActor(grpc::ServerContext* ctx, const rpc::GetActorRequest* req,
                            rpc::GetActorReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  actors_.Get(ctx, *req, reply);
  return grpc::Status::OK;
}

grpc::Status Head::KillActor(grpc::ServerContext* ctx, const rpc::KillActorRequest* req,
                             rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  actors_.Kill(*req);
  return grpc::Status::OK;
}

void Head::Charge(const std::string& node_id, const ResourceMap& res) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  auto avail = ToResourceMap(names_, it->second.Available());
  Subtract(avail, res);
  SetAvailable(names_, avail, &it->second);
  IndexNodeLocked(it->first, it->second);
}

// ------------------------------------------------------------------------------- jobs

grpc::Status Head::RegisterJob(grpc::ServerContext* ctx, const rpc::JobRequest* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  jobs_[req->job_id()] = *req;
  resumed_jobs_.erase(req->job_id());
  SaveDriverJobLocked(*req, /*finished=*/false);
  return grpc::Status::OK;
}

grpc::Status Head::FinishJob(grpc::ServerContext* ctx, const rpc::JobRequest* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  {
    MutexLock lock(mu_);
    FinishJobLocked(req->job_id());
  }
  NoteDriverEndedTasks(req->job_id(), req->tasks_finished(), req->tasks_failed());
  return grpc::Status::OK;
}

grpc::Status Head::WatchJob(grpc::ServerContext* ctx, const rpc::JobRequest* req,
                            grpc::ServerWriter<rpc::Empty>*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  // gRPC's sync API has no event for a cancelled call: it is polled; Stop wakes the wait.
  while (!ctx->IsCancelled() && !stopping_) stop_cv_.WaitFor(lock, std::chrono::milliseconds(100));
  if (stopping_) return grpc::Status::OK;
  if (jobs_.count(req->job_id())) {
    TORUS_LOG(WARNING) << "driver of job " << req->job_id() << " went away without Shutdown()";
    FinishJobLocked(req->job_id());
  }
  return grpc::Status::OK;
}

void Head::FinishJobLocked(const std::string& job_id) {
  if (auto it = jobs_.find(job_id); it != jobs_.end()) SaveDriverJobLocked(it->second, /*finished=*/true);
  jobs_.erase(job_id);
  finished_jobs_.Add(job_id);  // the nodes stop its idle workers
  // Non-detached actors and placement groups die with the job that created them.
  actors_.AssertHeld();  // it shares mu_
  actors_.FinishJobLocked(job_id);
  pg_manager_.AssertHeld();  // it shares mu_
  pg_manager_.RemoveJobGroups(job_id);
}

grpc::Status Head::List(grpc::ServerContext* ctx, const rpc::Empty*, rpc::ListReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  for (const auto& [id, n] : nodes_) FillRecord(names_, id, n, /*full=*/true, reply->add_nodes());
  actors_.AssertHeld();  // it shares mu_
  actors_.AppendTo(reply);
  for (const auto& [id, j] : jobs_) *reply->add_jobs() = j;
  pg_manager_.AssertHeld();  // it shares mu_
  pg_manager_.AppendTo(reply);
  const auto now = std::chrono::steady_clock::now();
  // Every live node beats at least once per node timeout, and registers again on its first
  // beat to a head that does not know it.
  reply->set_settling(now - started_at_ < std::chrono::milliseconds(cfg_.node_timeout_ms));
  return grpc::Status::OK;
}

// ------------------------------------------------------------------------------- placement groups

grpc::Status Head::CreatePlacementGroup(grpc::ServerContext* ctx, const rpc::PlacementGroupRecord* req,
                                        rpc::CreatePlacementGroupReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return pg_manager_.Create(*req, reply);
}

grpc::Status Head::RemovePlacementGroup(grpc::ServerContext* ctx, const rpc::PlacementGroupRequest* req,
                                        rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return pg_manager_.Remove(*req);
}

grpc::Status Head::GetPlacementGroup(grpc::ServerContext* ctx, const rpc::PlacementGroupRequest* req,
                                     rpc::GetPlacementGroupReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return pg_manager_.Get(ctx, *req, reply);
}

bool Head::NodeMatches(const LabelSelectorTerms& selector, const std::string& node_id) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return false;
  return MatchesLabels(selector, NodeLabels{names_, it->first, it->second});
}

std::string Head::NodeAddress(const std::string& node_id) {
  auto it = nodes_.find(node_id);
  return it == nodes_.end() ? std::string() : it->second.address;
}

void Head::OnPgCreated() {
  BumpView();
  actors_.AssertHeld();  // it shares mu_
  actors_.OnPgCreatedLocked();
}

void Head::OnPgRemoved(const std::string& pg_id, const std::string& why) {
  actors_.AssertHeld();  // it shares mu_
  actors_.OnPgRemovedLocked(pg_id, why);
}

void Head::OnPgSliceLost(const std::string& pg_id) {
  actors_.AssertHeld();  // it shares mu_
  actors_.OnPgSliceLostLocked(pg_id);
}

void Head::ApplyLedger(const NodeCall& call, const BundleReply& reply) {
  if (call.node_id.empty()) return;
  auto it = nodes_.find(call.node_id);
  if (it == nodes_.end() || it->second.address != call.address) return;
  auto& e = it->second;
  if (reply.ledger_seq < e.ledger_seq) return;
  e.ledger_seq = reply.ledger_seq;
  CompactResources available;
  available.reserve(reply.available.size());
  for (const auto& a : reply.available) {
    available.emplace_back(names_.Intern(reply.Name(a)), ResourceAmount::FromUnits(a.units));
  }
  // By name id; a name given twice keeps its last amount, as parsing into a map would.
  std::stable_sort(available.begin(), available.end(),
                   [](const auto& x, const auto& y) { return x.first < y.first; });
  size_t kept = 0;
  for (size_t k = 0; k < available.size(); ++k) {
    if (kept > 0 && available[kept - 1].first == available[k].first) {
      available[kept - 1] = available[k];
    } else {
      available[kept++] = available[k];
    }
  }
  available.resize(kept);
  if (available != e.Available()) {
    SetAvailable(std::move(available), &e);
    IndexNodeLocked(it->first, e);
    BumpView(&it->first);
  }
}

void Head::IndexNodeLocked(const std::string& node_id, NodeEntry& n) {
  if (!n.alive) {
    slice_index_.Remove(node_id);
    placement_index_.Remove(n);
    return;
  }
  placement_index_.Upsert(node_id, n);
  const NamePool* names = &names_;  // read in the lambdas below, under mu_
  auto label = [&](std::string_view k) { return LabelOf(*names, node_id, n, k); };
  std::string pod_type = label(tpu::kLabelPodType);
  if (pod_type.empty()) {
    slice_index_.Remove(node_id);
    return;
  }
  auto amount = [&](const CompactResources& r, const std::string& k) { return Amount(*names, r, k); };
  std::string head = SliceIdleRule::HeadUnit(pod_type);
  SliceHostUse use{amount(*n.total, "TPU"), amount(n.Available(), "TPU"), amount(*n.total, head),
                   amount(n.Available(), head)};
  SliceHostInfo info = MakeSliceHostInfo(std::move(pod_type), label(tpu::kLabelSliceName),
                                         label(tpu::kLabelTopology), label(tpu::kLabelWorkerId), use);
  slice_index_.Upsert(node_id, info);
}

grpc::Status Head::QuerySlices(grpc::ServerContext* ctx, const rpc::SliceQueryRequest* req,
                               rpc::SliceQueryReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  std::map<std::string, int> index_of;
  auto view = ViewOfNodes(&index_of, /*with_labels=*/true);
  if (!req->topology().empty() || !req->accelerator_version().empty()) {
    auto shape = tpu::ComputeSliceShape(req->accelerator_version(), req->topology(),
                                        req->chips_per_vm() > 0 ? std::optional<int>(req->chips_per_vm())
                                                                : std::nullopt);
    if (!shape.ok()) {
      SetError(reply->mutable_error(), StatusCode::kInvalidArgument, shape.status().message());
      return grpc::Status::OK;
    }
    for (const auto& s : FindSlices(view, *shape, req->chips_per_vm() > 0
                                                      ? std::optional<int>(req->chips_per_vm())
                                                      : std::nullopt)) {
      reply->set_intact(reply->intact() + s.intact);
      pg_manager_.AssertHeld();  // it shares mu_
      reply->set_ready(reply->ready() + (s.idle && pg_manager_.HolderOf(s.name).empty()));
    }
  }
  for (const auto& s : AllSlices(view)) {
    auto* out = reply->add_slices();
    out->set_name(s.name);
    out->set_pod_type(s.pod_type);
    out->set_topology(s.topology);
    out->set_hosts_expected(s.hosts_expected);
    int alive = 0;
    for (int h : s.hosts) {
      alive += h >= 0;
      out->add_node_ids(h >= 0 ? view[h].id : "");
    }
    out->set_hosts_alive(alive);
    pg_manager_.AssertHeld();  // it shares mu_
    std::string holder = pg_manager_.HolderOf(s.name);
    out->set_holder(holder);
    out->set_state(!s.intact ? rpc::SliceSummary::BROKEN
                             : !holder.empty() ? rpc::SliceSummary::RESERVED : rpc::SliceSummary::FREE);
    if (s.name == req->slice_name()) {
      for (int h : s.hosts) {
        if (h >= 0) reply->add_node_ids(view[h].id);
      }
    }
  }
  // A slice with a name the head knows only partially (e.g. missing hosts) still lists its nodes.
  if (!req->slice_name().empty() && reply->node_ids_size() == 0) {
    std::map<int, std::string> by_worker;
    for (const auto& v : view) {
      auto it = v.labels.find(std::string(tpu::kLabelSliceName));
      if (it == v.labels.end() || it->second != req->slice_name()) continue;
      auto w = v.labels.find(std::string(tpu::kLabelWorkerId));
      int wid = 0;
      try {
        wid = w == v.labels.end() ? 0 : std::stoi(w->second);
      } catch (...) {
      }
      by_worker[wid] = v.id;
    }
    for (const auto& [w, id] : by_worker) reply->add_node_ids(id);
  }
  return grpc::Status::OK;
}

grpc::Status Head::Shutdown(grpc::ServerContext* ctx, const rpc::Empty*, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  // Not on this handler thread: stopping waits for the server's handlers, this one included.
  shutdown_.Run([this] { Stop(); });
  return grpc::Status::OK;
}

}  // namespace torus
