#include "head/head.h"

#include <algorithm>

#include <google/protobuf/util/message_differencer.h>

#include "common/logging.h"
#include "common/rpc.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;

void SetError(rpc::Error* e, StatusCode code, const std::string& msg) {
  e->set_code(static_cast<int>(code));
  e->set_message(msg);
}
}  // namespace

Head::Head(HeadConfig cfg) : cfg_(std::move(cfg)) {}

Head::~Head() { Stop(); }

Status Head::Start() {
  int port = cfg_.port;
  server_ = StartServer(cfg_.bind_host, &port, {this});
  if (!server_ || port == 0) {
    return Unavailable("head cannot listen on " + cfg_.bind_host + ":" + std::to_string(cfg_.port) +
                       " (port in use?)");
  }
  address_ = cfg_.bind_host + ":" + std::to_string(port);
  TORUS_LOG(INFO) << "head listening on " << address_ << ", session " << cfg_.session_dir;
  monitor_thread_ = std::thread([this] { MonitorLoop(); });
  return Status::Ok();
}

void Head::Wait() {
  std::unique_lock<std::mutex> lock(stop_mu_);
  stopped_cv_.wait(lock, [this] { return stopped_; });
}

void Head::Stop() {
  if (stopping_.exchange(true)) {
    Wait();
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  if (monitor_thread_.joinable()) monitor_thread_.join();
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  std::lock_guard<std::mutex> lock(stop_mu_);
  stopped_ = true;
  stopped_cv_.notify_all();
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
  std::lock_guard<std::mutex> lock(mu_);
  auto& e = nodes_[n.node_id()];
  bool fresh = e.rec.node_id().empty();
  e.rec = n;
  e.rec.set_alive(true);
  e.rec.set_start_time_ms(std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count());
  e.last_heartbeat = Clock::now();
  BumpView();
  reply->set_session_dir(cfg_.session_dir);
  TORUS_LOG(INFO) << (fresh ? "node registered: " : "node re-registered: ") << n.node_id() << " at "
                  << n.address() << " " << ResourcesToString(FromProto(n.total()));
  SchedulePendingActors();
  return grpc::Status::OK;
}

grpc::Status Head::UnregisterNode(grpc::ServerContext* ctx, const rpc::UnregisterNodeRequest* req,
                                  rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(req->node_id());
  if (it == nodes_.end()) return grpc::Status::OK;
  it->second.rec.set_alive(false);
  BumpView();
  TORUS_LOG(INFO) << "node left: " << req->node_id();
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
  std::lock_guard<std::mutex> lock(mu_);
  auto it = nodes_.find(req->node_id());
  if (it == nodes_.end() || !it->second.rec.alive()) {
    reply->set_unknown_node(true);
    return grpc::Status::OK;
  }
  auto& e = it->second;
  e.last_heartbeat = Clock::now();
  bool changed = !google::protobuf::util::MessageDifferencer::Equals(e.rec.available(),
                                                                     req->available());
  if (changed) {
    *e.rec.mutable_available() = req->available();
    BumpView();
  }
  e.rec.mutable_pending()->CopyFrom(req->pending());
  reply->set_view_version(view_version_);
  if (req->view_version() != view_version_) {
    for (const auto& [id, n] : nodes_) {
      if (!n.rec.alive()) continue;
      auto* r = reply->add_nodes();
      r->set_node_id(n.rec.node_id());
      r->set_address(n.rec.address());
      r->set_alive(true);
      *r->mutable_total() = n.rec.total();
      *r->mutable_available() = n.rec.available();
    }
  }
  if (changed) SchedulePendingActors();
  return grpc::Status::OK;
}

void Head::MonitorLoop() {
  while (!stopping_) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    std::lock_guard<std::mutex> lock(mu_);
    auto now = Clock::now();
    for (auto& [id, n] : nodes_) {
      if (!n.rec.alive()) continue;
      if (now - n.last_heartbeat > std::chrono::milliseconds(cfg_.node_timeout_ms)) {
        n.rec.set_alive(false);
        BumpView();
        TORUS_LOG(WARNING) << "node " << id << " missed heartbeats for " << cfg_.node_timeout_ms
                           << " ms: declared dead";
        for (auto& [aid, a] : actors_) {
          if (a.rec.node_id() == id && a.rec.state() == "ALIVE") {
            OnActorWorkerGone(a, "its node " + id + " died", false);
          }
        }
      }
    }
    SchedulePendingActors();
  }
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
  std::lock_guard<std::mutex> lock(mu_);
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
  ActorEntry& a = actors_[id];
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
    // Least-loaded feasible node, by free CPU.
    const NodeEntry* best = nullptr;
    bool feasible = false;
    for (const auto& [nid, n] : nodes_) {
      if (!n.rec.alive()) continue;
      if (Fits(placement, FromProto(n.rec.total()))) feasible = true;
      auto avail = FromProto(n.rec.available());
      if (!Fits(placement, avail)) continue;
      if (!best || avail["CPU"] > FromProto(best->rec.available())["CPU"]) best = &n;
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
    NodeEntry& target = nodes_[best->rec.node_id()];
    auto avail = FromProto(target.rec.available());
    Subtract(avail, placement);
    ToProto(avail, target.rec.mutable_available());
    std::thread([this, id = id, nid = target.rec.node_id(), addr = target.rec.address()] {
      PlaceActor(id, nid, addr);
    }).detach();
  }
}

void Head::PlaceActor(const std::string& actor_id, const std::string& node_id,
                      const std::string& node_address) {
  rpc::StartActorRequest req;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = actors_.find(actor_id);
    if (it == actors_.end() || stopping_) return;
    const auto& spec = it->second.spec;
    *req.mutable_creation() = spec.creation();
    req.mutable_creation()->set_restarted(it->second.rec.num_restarts() > 0);
    req.set_executable(spec.executable());
    req.mutable_code_search_path()->CopyFrom(spec.code_search_path());
    *req.mutable_resources() = spec.resources();
    it->second.rec.set_node_id(node_id);
  }
  auto stub = rpc::Node::NewStub(GetChannel(node_address));
  rpc::StartActorReply reply;
  auto ctx = NewContext(cfg_.token);
  auto st = stub->StartActor(ctx.get(), req, &reply);
  std::lock_guard<std::mutex> lock(mu_);
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
    cv_.notify_all();
    return;
  }
  if (!reply.ok()) {
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("the actor's constructor failed: " + reply.error().message());
    TORUS_LOG(WARNING) << "actor " << actor_id << " " << a.rec.death_cause();
    cv_.notify_all();
    return;
  }
  a.rec.set_state("ALIVE");
  a.rec.set_worker_id(reply.worker_id());
  a.rec.set_address(reply.worker_address());
  cv_.notify_all();
}

void Head::KillActorWorker(const rpc::ActorRecord& rec) {
  auto it = nodes_.find(rec.node_id());
  if (it == nodes_.end() || rec.worker_id().empty()) return;
  std::string addr = it->second.rec.address();
  std::string wid = rec.worker_id();
  std::string token = cfg_.token;
  std::thread([addr, wid, token] {
    auto stub = rpc::Node::NewStub(GetChannel(addr));
    rpc::KillWorkerRequest req;
    req.set_worker_id(wid);
    req.set_force(true);
    rpc::Empty e;
    auto ctx = NewContext(token, 5000);
    (void)stub->KillWorker(ctx.get(), req, &e);
  }).detach();
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
  cv_.notify_all();
}

grpc::Status Head::ActorStarted(grpc::ServerContext* ctx, const rpc::ActorStartedRequest*,
                                rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  return grpc::Status::OK;  // placement reports through StartActor's reply
}

grpc::Status Head::ActorWorkerDied(grpc::ServerContext* ctx, const rpc::ActorWorkerDiedRequest* req,
                                   rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
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
  std::unique_lock<std::mutex> lock(mu_);
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
    cv_.wait_until(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
  }
}

grpc::Status Head::KillActor(grpc::ServerContext* ctx, const rpc::KillActorRequest* req,
                             rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(req->actor_id());
  if (it == actors_.end()) return grpc::Status::OK;
  ActorEntry& a = it->second;
  if (req->no_restart()) a.no_restart = true;
  if (a.rec.state() == "ALIVE") {
    KillActorWorker(a.rec);
  } else if (req->no_restart() && a.rec.state() != "DEAD") {
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("the actor was killed before it started");
    cv_.notify_all();
  }
  return grpc::Status::OK;
}

// ------------------------------------------------------------------------------- jobs

grpc::Status Head::RegisterJob(grpc::ServerContext* ctx, const rpc::JobRequest* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  jobs_[req->job_id()] = *req;
  return grpc::Status::OK;
}

grpc::Status Head::FinishJob(grpc::ServerContext* ctx, const rpc::JobRequest* req, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.erase(req->job_id());
  // Non-detached actors die with the job that created them.
  for (auto& [id, a] : actors_) {
    if (a.rec.job_id() != req->job_id() || a.rec.detached() || a.rec.state() == "DEAD") continue;
    a.no_restart = true;
    if (a.rec.state() == "ALIVE") KillActorWorker(a.rec);
    a.rec.set_state("DEAD");
    a.rec.set_death_cause("the job that created the actor finished");
  }
  cv_.notify_all();
  return grpc::Status::OK;
}

grpc::Status Head::List(grpc::ServerContext* ctx, const rpc::Empty*, rpc::ListReply* reply) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, n] : nodes_) *reply->add_nodes() = n.rec;
  for (const auto& [id, a] : actors_) *reply->add_actors() = a.rec;
  for (const auto& [id, j] : jobs_) *reply->add_jobs() = j;
  return grpc::Status::OK;
}

grpc::Status Head::Shutdown(grpc::ServerContext* ctx, const rpc::Empty*, rpc::Empty*) {
  if (auto s = CheckToken(ctx, cfg_.token); !s.ok()) return s;
  std::thread([this] { Stop(); }).detach();
  return grpc::Status::OK;
}

}  // namespace torus
