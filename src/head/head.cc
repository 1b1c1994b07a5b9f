#include "head/head.h"

#include <algorithm>
#include <set>

#include "common/ids.h"
#include "common/lane.h"
#include "common/logging.h"
#include "head/slice_idle.h"
#include "head/slices.h"
#include "tpu/topology.h"
#include "common/rpc.h"
#include "common/session.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;

void SetError(rpc::Error* e, StatusCode code, const std::string& msg) {
  e->set_code(static_cast<int>(code));
  e->set_message(msg);
}

// What a node registers must hold to the rules `torus start` applies, so that a hand-made
// RegisterNode cannot inject negative or absurd capacities.
Status ValidateNodeRecord(const rpc::NodeRecord& n) {
  if (auto s = ValidateResources(FromProto(n.total()), "node " + n.node_id() + " resources"); !s.ok()) {
    return s;
  }
  std::map<std::string, std::string> labels(n.labels().begin(), n.labels().end());
  return ValidateRegisteredLabels(labels, n.node_id(), n.hostname());
}

}  // namespace

Head::Head(HeadConfig cfg) : cfg_(std::move(cfg)), pg_manager_(mu_, *this, work_, cfg_.token) {}

Head::~Head() {
  Stop();
  shutdown_.Join();
}

Status Head::Start() {
  if (auto s = ValidateToken(cfg_.token, "the head's configuration"); !s.ok()) return s;
  int port = cfg_.port;
  job_manager_ = std::make_unique<JobManager>(JobManagerConfig{cfg_.token, cfg_.session_dir});
  lane_ = std::make_unique<LaneServer>(cfg_.token, "head");
  lane_->Handle("/torus.rpc.Head/CreatePlacementGroup", this, &rpc::Head::Service::CreatePlacementGroup);
  lane_->Handle("/torus.rpc.Head/RemovePlacementGroup", this, &rpc::Head::Service::RemovePlacementGroup);
  lane_->Handle("/torus.rpc.Head/GetPlacementGroup", this, &rpc::Head::Service::GetPlacementGroup);
  lane_->Handle("/torus.rpc.Head/Heartbeat", this, &rpc::Head::Service::Heartbeat);
  if (lane_->Start(cfg_.bind_host) == 0) {
    TORUS_LOG(WARNING) << "head: no lane port on " << cfg_.bind_host << "; placement-group calls use gRPC";
  }
  std::string why;
  server_ = StartServer(cfg_.bind_host, &port, {this, job_manager_.get(), lane_.get()}, 0, &why);
  if (!server_ || port == 0) {
    lane_->Stop();
    return Unavailable("head cannot listen on " + cfg_.bind_host + ":" + std::to_string(cfg_.port) + ": " + why);
  }
  address_ = cfg_.bind_host + ":" + std::to_string(port);
  RegisterInProcessServer(address_, server_.get(), this);
  job_manager_->SetHeadAddress(address_);
  TORUS_LOG(INFO) << "head listening on " << address_ << ", session " << cfg_.session_dir;
  monitor_.Start(kMonitorPeriod, [this] { return MonitorTick(); });
  pg_manager_.Start();
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
  if (job_manager_) job_manager_->Stop();  // first: it still talks to our own service
  {
    MutexLock lock(mu_);
    cv_.NotifyAll();
    stop_cv_.NotifyAll();
    for (grpc::ClientContext* c : placing_calls_) c->TryCancel();
  }
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
  const std::string* id = &it->first;
  auto& e = it->second;
  if (!fresh) {
    auto old = node_by_address_.find(e.address);
    if (old != node_by_address_.end() && old->second == id) node_by_address_.erase(old);
  }
  SetFromRecord(names_, n, &e);
  e.known = true;
  e.ledger_seq = 0;
  e.pending.clear();
  node_by_address_.erase(std::string_view(e.address));
  node_by_address_.emplace(std::string_view(e.address), id);
  if (!e.alive) ++alive_nodes_;
  e.alive = true;
  e.start_time_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                        std::chrono::system_clock::now().time_since_epoch())
                        .count();
  e.last_heartbeat = Clock::now();
  IndexNodeLocked(*id, e);
  BumpView(id);
  NoteLane(n.address(), static_cast<int>(req->lane_port()), req->lane_unix());
  reply->set_session_dir(cfg_.session_dir);
  e.beat_ms = PacedHeartbeatMsLocked();
  reply->set_heartbeat_ms(e.beat_ms);
  TORUS_LOG(INFO) << (fresh ? "node registered: " : "node re-registered: ") << n.node_id() << " at "
                  << n.address() << " " << ResourcesToString(FromProto(n.total()));
  SchedulePendingActors();
  return grpc::Status::OK;
}

grpc::Status Head::UnregisterNode(grpc::ServerContext* ctx, const rpc::UnregisterNodeRequest* req,
                                  rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  auto it = nodes_.find(req->node_id());
  if (it == nodes_.end()) return grpc::Status::OK;
  if (it->second.alive) --alive_nodes_;
  it->second.alive = false;
  IndexNodeLocked(it->first, it->second);
  BumpView(&it->first);
  TORUS_LOG(INFO) << "node left: " << req->node_id();
  pg_manager_.AssertHeld();  // it shares mu_
  pg_manager_.OnNodeLost(req->node_id());
  for (auto& [id, a] : actors_) {
    if (a.rec.node_id() == req->node_id() &&
        (a.rec.state() == "ALIVE" || a.rec.state() == "PENDING")) {
      OnActorWorkerGone(a, "its node " + req->node_id() + " stopped", false);
    }
  }
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
  if (req->pending_size() > 0 || !e.pending.empty()) {
    e.pending.assign(req->pending().begin(), req->pending().end());
  }
  if (req->want_view() || alive_nodes_ <= static_cast<size_t>(cfg_.push_view_max_nodes)) {
    FillViewLocked(req->view_version(), reply);
  } else {
    reply->set_view_version(req->view_version());  // nothing shipped: the node keeps its view
  }
  if (changed) {
    SchedulePendingActors();
    pg_manager_.AssertHeld();  // it shares mu_
    pg_manager_.Wake();
  }
  return grpc::Status::OK;
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
      n.alive = false;
      --alive_nodes_;
      IndexNodeLocked(id, n);
      BumpView(&id);
      TORUS_LOG(WARNING) << "node " << id << " missed heartbeats for " << timeout_ms
                         << " ms: declared dead";
      for (auto& [aid, a] : actors_) {
        if (a.rec.node_id() == id && a.rec.state() == "ALIVE") {
          OnActorWorkerGone(a, "its node " + id + " died", false);
        }
      }
      pg_manager_.AssertHeld();  // it shares mu_
      pg_manager_.OnNodeLost(id);
    }
  }
  SchedulePendingActors();
  return kMonitorPeriod;
}

// ------------------------------------------------------------------------------- actors

grpc::Status Head::CreateActor(grpc::ServerContext* ctx, const rpc::CreateActorRequest* req,
                               rpc::CreateActorReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  const std::string& id = req->creation().actor_id();
  if (id.empty()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, "actor id missing");
    return grpc::Status::OK;
  }
  if (auto s = ValidateResources(FromProto(req->resources()), "actor resources");
      !s.ok()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, s.message());
    return grpc::Status::OK;
  }
  MutexLock lock(mu_);
  if (actors_.count(id)) return grpc::Status::OK;  // retried request
  if (!req->name().empty()) {
    auto key = std::make_pair(req->ray_namespace(), req->name());
    auto it = named_actors_.find(key);
    if (it != named_actors_.end() && actors_.count(it->second) &&
        actors_[it->second].rec.state() != "DEAD") {
      SetError(reply->mutable_error(), StatusCode::kAlreadyExists,
               "an actor named '" + req->name() + "' already exists in namespace '" +
                   req->ray_namespace() + "'");
      return grpc::Status::OK;
    }
    named_actors_[key] = id;
  }
  std::map<std::string, std::string> sel;
  for (const auto& t : req->label_selector()) sel[t.key()] = t.expr();
  auto terms = ParseLabelSelector(sel);
  if (!terms.ok()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, terms.status().message());
    if (!req->name().empty()) named_actors_.erase({req->ray_namespace(), req->name()});
    return grpc::Status::OK;
  }
  if (!req->placement_group_id().empty()) {
    pg_manager_.AssertHeld();  // it shares mu_
    const rpc::PlacementGroupRecord* pg = pg_manager_.Find(req->placement_group_id());
    if (!pg || pg->state() == "REMOVED") {
      SetError(reply->mutable_error(), StatusCode::kNotFound,
               "placement group " + req->placement_group_id() + " does not exist (or was removed)");
      if (!req->name().empty()) named_actors_.erase({req->ray_namespace(), req->name()});
      return grpc::Status::OK;
    }
    if (req->bundle_index() >= pg->bundles_size()) {
      SetError(reply->mutable_error(), StatusCode::kInvalidArgument,
               "bundle index " + std::to_string(req->bundle_index()) + " out of range: the group has " +
                   std::to_string(pg->bundles_size()) + " bundles");
      if (!req->name().empty()) named_actors_.erase({req->ray_namespace(), req->name()});
      return grpc::Status::OK;
    }
  }
  ActorEntry& a = actors_[id];
  a.selector = *terms;
  a.spec = *req;
  a.rec.set_actor_id(id);
  a.rec.set_name(req->name());
  a.rec.set_ray_namespace(req->ray_namespace());
  a.rec.set_state("PENDING");
  a.rec.set_max_restarts(req->max_restarts());
  a.rec.set_class_name(req->creation().function());
  a.rec.set_job_id(req->creation().job_id());
  a.rec.set_detached(req->detached());
  SchedulePendingActors();
  return grpc::Status::OK;
}

void Head::SchedulePendingActors() {
  for (auto& [id, a] : actors_) {
    if (a.placing || (a.rec.state() != "PENDING" && a.rec.state() != "RESTARTING")) continue;
    ResourceMap res = FromProto(a.spec.resources());
    ResourceMap placement = res.empty() ? ResourceMap{{"CPU", 1}} : res;
    if (!a.spec.placement_group_id().empty()) {
      // Inside a placement group: the bundle's node; the node checks the bundle's room.
      pg_manager_.AssertHeld();  // it shares mu_
      const rpc::PlacementGroupRecord* pg = pg_manager_.Find(a.spec.placement_group_id());
      if (!pg || pg->state() == "REMOVED") {
        a.rec.set_state("DEAD");
        a.rec.set_death_cause("its placement group was removed");
        cv_.NotifyAll();
        continue;
      }
      if (pg->state() != "CREATED") continue;  // wait for the group
      const rpc::Bundle* target = nullptr;
      for (const auto& b : pg->bundles()) {
        if (a.spec.bundle_index() >= 0 && b.index() != a.spec.bundle_index()) continue;
        if (Fits(res, FromProto(b.resources()))) {
          target = &b;
          break;
        }
      }
      if (!target) {
        std::string reason = "asks " + ResourcesToString(res) + ", more than its bundle holds";
        if (reason != a.pending_reason) {
          TORUS_LOG(WARNING) << "actor " << id << " " << reason << "; it stays pending";
          a.pending_reason = reason;
        }
        continue;
      }
      a.placing = true;
      a.pending_reason.clear();
      if (!work_.Post([this, id = id, nid = target->node_id(), addr = target->node_address()] {
            PlaceActor(id, nid, addr);
          })) {
        a.placing = false;  // stopping
      }
      continue;
    }
    // Least-loaded feasible node, by free CPU.
    const std::string* best = nullptr;
    double best_cpu = 0;
    bool feasible = false;
    for (const auto& [nid, n] : nodes_) {
      if (!n.alive) continue;
      if (!a.selector.empty() && !MatchesLabels(a.selector, LabelsOf(names_, nid, n))) continue;
      if (Fits(placement, ToResourceMap(names_, n.total))) feasible = true;
      auto avail = ToResourceMap(names_, n.Available());
      if (!Fits(placement, avail)) continue;
      if (!best || avail["CPU"] > best_cpu) {
        best = &nid;
        best_cpu = avail["CPU"];
      }
    }
    if (!best) {
      std::string reason = feasible ? "waiting for resources " + ResourcesToString(placement)
                                    : "infeasible: no node has " + ResourcesToString(placement);
      if (reason != a.pending_reason) {
        TORUS_LOG(INFO) << "actor " << id << " (" << a.rec.class_name() << ") " << reason;
        a.pending_reason = reason;
      }
      continue;
    }
    a.placing = true;
    a.pending_reason.clear();
    // Charge the view now so that a burst of creations spreads out.
    NodeEntry& target = nodes_[*best];
    auto avail = ToResourceMap(names_, target.Available());
    Subtract(avail, placement);
    SetAvailable(names_, avail, &target);
    if (!work_.Post([this, id = id, nid = *best, addr = target.address] { PlaceActor(id, nid, addr); })) {
      a.placing = false;  // stopping
    }
  }
}

void Head::PlaceActor(const std::string& actor_id, const std::string& node_id,
                      const std::string& node_address) {
  rpc::StartActorRequest req;
  auto ctx = NewContext(cfg_.token);
  {
    MutexLock lock(mu_);
    auto it = actors_.find(actor_id);
    if (it == actors_.end() || stopping_) return;
    placing_calls_.insert(ctx.get());  // Stop cancels it
    const auto& spec = it->second.spec;
    *req.mutable_creation() = spec.creation();
    req.mutable_creation()->set_restarted(it->second.rec.num_restarts() > 0);
    req.set_executable(spec.executable());
    req.mutable_worker_command()->CopyFrom(spec.worker_command());
    req.mutable_code_search_path()->CopyFrom(spec.code_search_path());
    *req.mutable_resources() = spec.resources();
    req.set_placement_group_id(spec.placement_group_id());
    req.set_bundle_index(spec.bundle_index());
    it->second.rec.set_node_id(node_id);
  }
  auto stub = rpc::Node::NewStub(GetChannel(node_address));
  rpc::StartActorReply reply;
  auto st = stub->StartActor(ctx.get(), req, &reply);
  MutexLock lock(mu_);
  placing_calls_.erase(ctx.get());
  auto it = actors_.find(actor_id);
  if (it == actors_.end()) return;
  ActorEntry& a = it->second;
  a.placing = false;
  if (a.rec.state() == "DEAD") {  // killed while being placed
    if (st.ok() && reply.ok()) {
      a.rec.set_worker_id(reply.worker_id());
      KillActorWorker(a.rec);
    }
    return;
  }
  if (!st.ok() || (reply.has_error() && reply.error().code() ==
                                            static_cast<int>(StatusCode::kResourceExhausted))) {
    // Node unreachable or its resources were taken meanwhile: try again later.
    a.rec.set_node_id("");
    cv_.NotifyAll();
    return;
  }
  if (!reply.ok()) {
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("the actor's constructor failed: " + reply.error().message());
    TORUS_LOG(WARNING) << "actor " << actor_id << " " << a.rec.death_cause();
    cv_.NotifyAll();
    return;
  }
  a.rec.set_state("ALIVE");
  a.rec.set_worker_id(reply.worker_id());
  a.rec.set_address(reply.worker_address());
  cv_.NotifyAll();
}

void Head::KillActorWorker(const rpc::ActorRecord& rec) {
  auto it = nodes_.find(rec.node_id());
  if (it == nodes_.end() || rec.worker_id().empty()) return;
  std::string addr = it->second.address;
  std::string wid = rec.worker_id();
  std::string token = cfg_.token;
  (void)work_.Post([addr, wid, token] {
    auto stub = rpc::Node::NewStub(GetChannel(addr));
    rpc::KillWorkerRequest req;
    req.set_worker_id(wid);
    req.set_force(true);
    rpc::Empty e;
    auto ctx = NewContext(token, 5000);
    (void)stub->KillWorker(ctx.get(), req, &e);
  });
}

void Head::OnActorWorkerGone(ActorEntry& a, const std::string& cause, bool intentional) {
  if (a.rec.state() == "DEAD") return;
  int max = a.rec.max_restarts();
  bool can_restart = !intentional && !a.no_restart && (max < 0 || a.rec.num_restarts() < max);
  a.rec.set_address("");
  a.rec.set_worker_id("");
  if (can_restart) {
    a.rec.set_state("RESTARTING");
    a.rec.set_num_restarts(a.rec.num_restarts() + 1);
    TORUS_LOG(INFO) << "actor " << a.rec.actor_id() << " restarting (" << a.rec.num_restarts()
                    << "/" << (max < 0 ? std::string("inf") : std::to_string(max))
                    << ") because " << cause;
  } else {
    a.rec.set_state("DEAD");
    a.rec.set_death_cause(cause);
  }
  cv_.NotifyAll();
}

grpc::Status Head::ActorStarted(grpc::ServerContext* ctx, const rpc::ActorStartedRequest*,
                                rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return grpc::Status::OK;  // placement reports through StartActor's reply
}

grpc::Status Head::ActorWorkerDied(grpc::ServerContext* ctx, const rpc::ActorWorkerDiedRequest* req,
                                   rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  auto it = actors_.find(req->actor_id());
  if (it == actors_.end()) return grpc::Status::OK;
  ActorEntry& a = it->second;
  // Ignore a stale report about an earlier incarnation.
  if (!req->worker_id().empty() && req->worker_id() != a.rec.worker_id()) return grpc::Status::OK;
  std::string cause = req->description();
  if (a.no_restart) cause = "the actor was killed with ray::KillActor / handle.Kill()";
  if (req->intentional() && cause.empty()) cause = "the actor called ray::ExitActor()";
  OnActorWorkerGone(a, cause, req->intentional());
  SchedulePendingActors();
  return grpc::Status::OK;
}

grpc::Status Head::GetActor(grpc::ServerContext* ctx, const rpc::GetActorRequest* req,
                            rpc::GetActorReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  std::string id = req->actor_id();
  if (id.empty()) {
    auto it = named_actors_.find({req->ray_namespace(), req->name()});
    if (it == named_actors_.end()) return grpc::Status::OK;
    id = it->second;
  }
  auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, req->wait_alive_ms()));
  while (true) {
    auto it = actors_.find(id);
    if (it == actors_.end()) return grpc::Status::OK;
    const auto& rec = it->second.rec;
    bool settled = rec.state() == "DEAD" ||
                   (rec.state() == "ALIVE" && rec.num_restarts() >= req->min_restarts());
    if (settled || req->wait_alive_ms() <= 0 || Clock::now() >= deadline || stopping_ ||
        ctx->IsCancelled()) {
      if (!req->name().empty() && rec.state() == "DEAD") return grpc::Status::OK;
      reply->set_found(true);
      *reply->mutable_actor() = rec;
      return grpc::Status::OK;
    }
    cv_.WaitUntil(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
  }
}

grpc::Status Head::KillActor(grpc::ServerContext* ctx, const rpc::KillActorRequest* req,
                             rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  auto it = actors_.find(req->actor_id());
  if (it == actors_.end()) return grpc::Status::OK;
  ActorEntry& a = it->second;
  if (req->no_restart()) a.no_restart = true;
  if (a.rec.state() == "ALIVE") {
    KillActorWorker(a.rec);
  } else if (req->no_restart() && a.rec.state() != "DEAD") {
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("the actor was killed before it started");
    cv_.NotifyAll();
  }
  return grpc::Status::OK;
}

// ------------------------------------------------------------------------------- jobs

grpc::Status Head::RegisterJob(grpc::ServerContext* ctx, const rpc::JobRequest* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  jobs_[req->job_id()] = *req;
  return grpc::Status::OK;
}

grpc::Status Head::FinishJob(grpc::ServerContext* ctx, const rpc::JobRequest* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  FinishJobLocked(req->job_id());
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
  jobs_.erase(job_id);
  // Non-detached actors and placement groups die with the job that created them.
  for (auto& [id, a] : actors_) {
    if (a.rec.job_id() != job_id || a.rec.detached() || a.rec.state() == "DEAD") continue;
    a.no_restart = true;
    if (a.rec.state() == "ALIVE") KillActorWorker(a.rec);
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("the job that created the actor finished");
  }
  pg_manager_.AssertHeld();  // it shares mu_
  pg_manager_.RemoveJobGroups(job_id);
  cv_.NotifyAll();
}

grpc::Status Head::List(grpc::ServerContext* ctx, const rpc::Empty*, rpc::ListReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  MutexLock lock(mu_);
  for (const auto& [id, n] : nodes_) FillRecord(names_, id, n, /*full=*/true, reply->add_nodes());
  for (const auto& [id, a] : actors_) *reply->add_actors() = a.rec;
  for (const auto& [id, j] : jobs_) *reply->add_jobs() = j;
  pg_manager_.AssertHeld();  // it shares mu_
  pg_manager_.AppendTo(reply);
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
  SchedulePendingActors();
  cv_.NotifyAll();
}

void Head::OnPgRemoved(const std::string& pg_id, const std::string& why) {
  for (auto& [id, a] : actors_) {
    if (a.spec.placement_group_id() != pg_id || a.rec.state() == "DEAD") continue;
    a.no_restart = true;
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("its placement group was removed (" + why + ")");
  }
  cv_.NotifyAll();
}

void Head::OnPgSliceLost(const std::string& pg_id) {
  for (auto& [aid, a] : actors_) {
    if (a.spec.placement_group_id() == pg_id && a.rec.state() == "ALIVE") KillActorWorker(a.rec);
  }
}

void Head::ApplyLedger(const std::string& node_address, const BundleReply& reply) {
  auto id = node_by_address_.find(node_address);
  if (id == node_by_address_.end()) return;
  auto it = nodes_.find(*id->second);
  if (it == nodes_.end() || it->second.address != node_address) return;
  auto& e = it->second;
  if (reply.ledger_seq < e.ledger_seq) return;
  e.ledger_seq = reply.ledger_seq;
  CompactResources available;
  available.reserve(reply.available.size());
  for (const auto& a : reply.available) available.emplace_back(names_.Intern(reply.Name(a)), a.value);
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

void Head::IndexNodeLocked(const std::string& node_id, const NodeEntry& n) {
  if (!n.alive) {
    slice_index_.Remove(node_id);
    return;
  }
  const NamePool* names = &names_;  // read in the lambdas below, under mu_
  auto label = [&](std::string_view k) { return LabelOf(*names, node_id, n, k); };
  std::string pod_type = label(tpu::kLabelPodType);
  if (pod_type.empty()) {
    slice_index_.Remove(node_id);
    return;
  }
  auto amount = [&](const CompactResources& r, const std::string& k) { return Amount(*names, r, k); };
  std::string head = SliceIdleRule::HeadUnit(pod_type);
  SliceHostUse use{amount(n.total, "TPU"), amount(n.Available(), "TPU"), amount(n.total, head),
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
    out->set_state(!s.intact ? "broken" : !holder.empty() ? "reserved" : "free");
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
