#include "head/actors.h"

#include <algorithm>

#include "common/logging.h"
#include "common/rpc.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

void ActorDirectory::Create(const rpc::CreateActorRequest& req, rpc::CreateActorReply* reply) {
  const std::string& id = req.creation().actor_id();
  if (id.empty()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, "actor id missing");
    return;
  }
  if (auto s = ValidateResourceSet(req.resources(), "actor resources"); !s.ok()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, s.message());
    return;
  }
  MutexLock lock(mu_);
  if (actors_.count(id)) return;  // retried request
  TrimDeadLocked();
  if (!req.name().empty()) {
    auto key = std::make_pair(req.ray_namespace(), req.name());
    auto it = named_.find(key);
    if (it != named_.end() && actors_.count(it->second) &&
        actors_[it->second].rec.state() != rpc::ActorRecord::DEAD) {
      SetError(reply->mutable_error(), StatusCode::kAlreadyExists,
               "an actor named '" + req.name() + "' already exists in namespace '" +
                   req.ray_namespace() + "'");
      return;
    }
    named_[key] = id;
  }
  std::map<std::string, std::string> sel;
  for (const auto& t : req.label_selector()) sel[t.key()] = t.expr();
  auto terms = ParseLabelSelector(sel);
  if (!terms.ok()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, terms.status().message());
  }
  if (!terms.ok() || !CheckGroupLocked(req, reply)) {
    if (!req.name().empty()) named_.erase({req.ray_namespace(), req.name()});
    return;
  }
  ActorEntry& a = actors_[id];
  a.selector = *terms;
  a.spec = req;
  a.rec.set_actor_id(id);
  a.rec.set_name(req.name());
  a.rec.set_ray_namespace(req.ray_namespace());
  a.rec.set_state(rpc::ActorRecord::PENDING);
  a.rec.set_max_restarts(req.max_restarts());
  a.rec.set_class_name(req.creation().function());
  a.rec.set_job_id(req.creation().job_id());
  a.rec.set_detached(req.detached());
  SaveLocked(a);
  ScheduleLocked();
  // The creator warns its user (core/infeasible_warning.h); the actor stays pending meanwhile.
  if (a.pending_reason.rfind("infeasible", 0) == 0) reply->set_warning(a.pending_reason);
}

bool ActorDirectory::CheckGroupLocked(const rpc::CreateActorRequest& req, rpc::CreateActorReply* reply) {
  if (req.placement_group_id().empty()) return true;
  pgs_.AssertHeld();  // it shares mu_
  const rpc::PlacementGroupRecord* pg = pgs_.Find(req.placement_group_id());
  if (!pg || pg->state() == rpc::PlacementGroupRecord::REMOVED) {
    SetError(reply->mutable_error(), StatusCode::kNotFound,
             "placement group " + req.placement_group_id() + " does not exist (or was removed)");
    return false;
  }
  if (req.bundle_index() >= pg->bundles_size()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument,
             "bundle index " + std::to_string(req.bundle_index()) + " out of range: the group has " +
                 std::to_string(pg->bundles_size()) + " bundles");
    return false;
  }
  return true;
}

void ActorDirectory::ScheduleLocked() {
  for (auto& [id, a] : actors_) {
    if (a.placing ||
        (a.rec.state() != rpc::ActorRecord::PENDING && a.rec.state() != rpc::ActorRecord::RESTARTING)) {
      continue;
    }
    if (!a.spec.placement_group_id().empty()) {
      PlaceInGroupLocked(id, a);
    } else {
      PlaceOnNodeLocked(id, a);
    }
  }
}

void ActorDirectory::PlaceInGroupLocked(const std::string& id, ActorEntry& a) {
  if (ResumePlacementLocked(id, a)) return;
  // Inside a placement group: the bundle's node; the node checks the bundle's room.
  ResourceMap res = FromProto(a.spec.resources());
  pgs_.AssertHeld();  // it shares mu_
  const rpc::PlacementGroupRecord* pg = pgs_.Find(a.spec.placement_group_id());
  if (!pg || pg->state() == rpc::PlacementGroupRecord::REMOVED) {
    a.rec.set_state(rpc::ActorRecord::DEAD);
    a.rec.set_death_cause("its placement group was removed");
    SaveLocked(a);
    cv_.NotifyAll();
    return;
  }
  if (pg->state() != rpc::PlacementGroupRecord::CREATED) return;  // wait for the group
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
    return;
  }
  PostPlacementLocked(id, a, target->node_id(), target->node_address());
}

bool ActorDirectory::ResumePlacementLocked(const std::string& id, ActorEntry& a) {
  if (a.resume_node.empty()) return false;
  std::string address = nodes_.NodeAddress(a.resume_node);
  auto n = nodes_.Nodes().find(a.resume_node);
  if (n != nodes_.Nodes().end() && n->second.alive && !address.empty()) {
    std::string node = std::move(a.resume_node);
    a.resume_node.clear();
    PostPlacementLocked(id, a, node, address);
    return true;
  }
  return resume_grace_;  // the node may still come back: wait for it until the grace ends
}

void ActorDirectory::EndResumeGraceLocked() {
  resume_grace_ = false;
  for (auto& [id, a] : actors_) a.resume_node.clear();
  ScheduleLocked();
}

const std::string* ActorDirectory::ChooseNodeLocked(const PlacementIndex& index,
                                                    const PlacementIndex::Demand& demand, bool spread) {
  const std::string* best = nullptr;   // least loaded; for SPREAD the next id after the last
  const std::string* lowest = nullptr;  // SPREAD: the lowest id, where the round wraps
  const std::string last = spread_last_;  // a copy: the lambda is not known to run under mu_
  index.ForEach(demand, /*use_total=*/false, [&](uint32_t slot) {
    const std::string& id = index.Id(slot);
    if (!spread) {
      best = &id;
      return false;
    }
    if (!lowest || id < *lowest) lowest = &id;
    if (id > last && (!best || id < *best)) best = &id;
    return true;
  });
  if (spread) {
    if (!best) best = lowest;
    if (best) spread_last_ = *best;
  }
  return best;
}

void ActorDirectory::PlaceOnNodeLocked(const std::string& id, ActorEntry& a) {
  if (ResumePlacementLocked(id, a)) return;
  ResourceMap res = FromProto(a.spec.resources());
  ResourceMap placement = res.empty() ? ResourceMap{{"CPU", 1}} : res;
  // The first candidate of the placement index: the node with the most of the actor's key
  // resource free (its scarcest one; CPU for a plain actor), i.e. the least loaded.
  const PlacementIndex& index = nodes_.Placement();
  PlacementIndex::Demand demand = index.Compile(placement, a.selector);
  const std::string* best = ChooseNodeLocked(index, demand, a.spec.spread());
  if (!best) {
    bool feasible = false;
    index.ForEach(demand, /*use_total=*/true, [&](uint32_t) {
      feasible = true;
      return false;
    });
    std::string reason = feasible ? "waiting for resources " + ResourcesToString(placement)
                                  : "infeasible: no node has " + ResourcesToString(placement);
    if (reason != a.pending_reason) {
      TORUS_LOG(INFO) << "actor " << id << " (" << a.rec.class_name() << ") " << reason;
      a.pending_reason = reason;
    }
    return;
  }
  // Charge the view now so that a burst of creations spreads out (this re-indexes the node: the
  // id is copied first).
  std::string node_id = *best;
  nodes_.Charge(node_id, placement);
  PostPlacementLocked(id, a, node_id, nodes_.NodeAddress(node_id));
}

void ActorDirectory::PostPlacementLocked(const std::string& id, ActorEntry& a, const std::string& node_id,
                                         const std::string& node_address) {
  a.placing = true;
  a.pending_reason.clear();
  if (!work_.Post([this, id, node_id, node_address] { Place(id, node_id, node_address); })) {
    a.placing = false;  // stopping
  }
}

void ActorDirectory::Place(const std::string& actor_id, const std::string& node_id,
                           const std::string& node_address) {
  rpc::StartActorRequest req;
  auto ctx = NewContext(token_);
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
    // The intent: a head resumed while this call runs asks the same node again, which answers
    // with the instance it started (node/actor_start.h) instead of a second one elsewhere.
    SaveLocked(it->second);
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
  if (a.rec.state() == rpc::ActorRecord::DEAD) {  // killed while being placed
    if (st.ok() && reply.ok()) {
      a.rec.set_worker_id(reply.worker_id());
      KillWorkerLocked(a.rec);
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
  const int code = reply.ok() ? 0 : reply.error().code();
  if (code == static_cast<int>(StatusCode::kWorkerDied) || code == static_cast<int>(StatusCode::kUnavailable)) {
    // The worker process died (or never registered) while the constructor ran: a worker
    // failure, not the constructor's; the actor restarts if its max_restarts allows (Ray's
    // semantics), on whichever node fits then.
    a.rec.set_node_id("");
    OnWorkerGoneLocked(a, "its worker died while the constructor ran: " + reply.error().message(), false);
    ScheduleLocked();
    return;
  }
  if (!reply.ok()) {
    a.rec.set_state(rpc::ActorRecord::DEAD);
    a.rec.set_death_cause("the actor's constructor failed: " + reply.error().message());
    TORUS_LOG(WARNING) << "actor " << actor_id << " " << a.rec.death_cause();
    SaveLocked(a);
    cv_.NotifyAll();
    return;
  }
  a.rec.set_state(rpc::ActorRecord::ALIVE);
  a.rec.set_worker_id(reply.worker_id());
  a.rec.set_address(reply.worker_address());
  SaveLocked(a);
  cv_.NotifyAll();
}

void ActorDirectory::KillWorkerLocked(const rpc::ActorRecord& rec) {
  std::string addr = nodes_.NodeAddress(rec.node_id());
  if (addr.empty() || rec.worker_id().empty()) return;
  std::string wid = rec.worker_id();
  std::string token = token_;
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

void ActorDirectory::OnWorkerGoneLocked(ActorEntry& a, const std::string& cause, bool intentional) {
  if (a.rec.state() == rpc::ActorRecord::DEAD) return;
  int max = a.rec.max_restarts();
  bool can_restart = !intentional && !a.no_restart && (max < 0 || a.rec.num_restarts() < max);
  a.rec.set_address("");
  a.rec.set_worker_id("");
  if (can_restart) {
    a.rec.set_state(rpc::ActorRecord::RESTARTING);
    a.rec.set_num_restarts(a.rec.num_restarts() + 1);
    TORUS_LOG(INFO) << "actor " << a.rec.actor_id() << " restarting (" << a.rec.num_restarts()
                    << "/" << (max < 0 ? std::string("inf") : std::to_string(max))
                    << ") because " << cause;
  } else {
    a.rec.set_state(rpc::ActorRecord::DEAD);
    a.rec.set_death_cause(cause);
  }
  SaveLocked(a);
  cv_.NotifyAll();
}

void ActorDirectory::WorkerDied(const rpc::ActorWorkerDiedRequest& req) {
  MutexLock lock(mu_);
  auto it = actors_.find(req.actor_id());
  if (it == actors_.end()) return;
  ActorEntry& a = it->second;
  // Ignore a stale report about an earlier incarnation.
  if (!req.worker_id().empty() && req.worker_id() != a.rec.worker_id()) return;
  std::string cause = req.description();
  if (a.no_restart) cause = "the actor was killed with ray::KillActor / handle.Kill()";
  if (req.intentional() && cause.empty()) cause = "the actor called ray::ExitActor()";
  OnWorkerGoneLocked(a, cause, req.intentional());
  ScheduleLocked();
}

void ActorDirectory::Get(grpc::ServerContext* ctx, const rpc::GetActorRequest& req,
                         rpc::GetActorReply* reply) {
  MutexLock lock(mu_);
  std::string id = req.actor_id();
  if (id.empty()) {
    auto it = named_.find({req.ray_namespace(), req.name()});
    if (it == named_.end()) return;
    id = it->second;
  }
  auto deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, req.wait_alive_ms()));
  while (true) {
    auto it = actors_.find(id);
    if (it == actors_.end()) return;
    const auto& rec = it->second.rec;
    bool settled = rec.state() == rpc::ActorRecord::DEAD ||
                   (rec.state() == rpc::ActorRecord::ALIVE &&
                    (req.not_worker_id().empty() || rec.worker_id() != req.not_worker_id()));
    if (settled || req.wait_alive_ms() <= 0 || Clock::now() >= deadline || stopping_ ||
        ctx->IsCancelled()) {
      if (!req.name().empty() && rec.state() == rpc::ActorRecord::DEAD) return;
      reply->set_found(true);
      *reply->mutable_actor() = rec;
      return;
    }
    cv_.WaitUntil(lock, std::min(deadline, Clock::now() + std::chrono::milliseconds(200)));
  }
}

std::optional<rpc::ActorRecord> ActorDirectory::FindNamed(const std::string& ns, const std::string& name) const {
  MutexLock lock(mu_);
  auto n = named_.find({ns, name});
  if (n == named_.end()) return std::nullopt;
  auto it = actors_.find(n->second);
  if (it == actors_.end() || it->second.rec.state() == rpc::ActorRecord::DEAD) return std::nullopt;
  return it->second.rec;
}

void ActorDirectory::Kill(const rpc::KillActorRequest& req) {
  MutexLock lock(mu_);
  auto it = actors_.find(req.actor_id());
  if (it == actors_.end()) return;
  ActorEntry& a = it->second;
  if (req.no_restart()) a.no_restart = true;
  SaveLocked(a);
  if (a.rec.state() == rpc::ActorRecord::ALIVE) {
    KillWorkerLocked(a.rec);
  } else if (req.no_restart() && a.rec.state() != rpc::ActorRecord::DEAD) {
    a.rec.set_state(rpc::ActorRecord::DEAD);
    a.rec.set_death_cause("the actor was killed before it started");
    SaveLocked(a);
    cv_.NotifyAll();
  }
}

void ActorDirectory::Stop() {
  MutexLock lock(mu_);
  cv_.NotifyAll();
  for (grpc::ClientContext* c : placing_calls_) c->TryCancel();
}

void ActorDirectory::OnNodeGoneLocked(const std::string& node_id, const std::string& cause, bool pending_too) {
  for (auto& [id, a] : actors_) {
    if (a.rec.node_id() == node_id &&
        (a.rec.state() == rpc::ActorRecord::ALIVE ||
         (pending_too && a.rec.state() == rpc::ActorRecord::PENDING))) {
      OnWorkerGoneLocked(a, cause, false);
    }
  }
}

void ActorDirectory::FinishJobLocked(const std::string& job_id) {
  // Non-detached actors die with the job that created them.
  for (auto& [id, a] : actors_) {
    if (a.rec.job_id() != job_id || a.rec.detached() || a.rec.state() == rpc::ActorRecord::DEAD) continue;
    a.no_restart = true;
    if (a.rec.state() == rpc::ActorRecord::ALIVE) KillWorkerLocked(a.rec);
    a.rec.set_state(rpc::ActorRecord::DEAD);
    a.rec.set_death_cause("the job that created the actor finished");
    SaveLocked(a);
  }
  cv_.NotifyAll();
}

void ActorDirectory::OnPgCreatedLocked() {
  ScheduleLocked();
  cv_.NotifyAll();
}

void ActorDirectory::OnPgRemovedLocked(const std::string& pg_id, const std::string& why) {
  for (auto& [id, a] : actors_) {
    if (a.spec.placement_group_id() != pg_id || a.rec.state() == rpc::ActorRecord::DEAD) continue;
    a.no_restart = true;
    a.rec.set_state(rpc::ActorRecord::DEAD);
    a.rec.set_death_cause("its placement group was removed (" + why + ")");
    SaveLocked(a);
  }
  cv_.NotifyAll();
}

void ActorDirectory::OnPgSliceLostLocked(const std::string& pg_id) {
  for (auto& [aid, a] : actors_) {
    if (a.spec.placement_group_id() == pg_id && a.rec.state() == rpc::ActorRecord::ALIVE) {
      KillWorkerLocked(a.rec);
    }
  }
}

void ActorDirectory::AppendTo(rpc::ListReply* reply) const {
  for (const auto& [id, a] : actors_) *reply->add_actors() = a.rec;
}

void ActorDirectory::TrimDeadLocked() {
  while (dead_order_.size() > kKeepDeadActors) {
    auto it = actors_.find(dead_order_.front());
    dead_order_.pop_front();
    if (it == actors_.end() || it->second.rec.state() != rpc::ActorRecord::DEAD) continue;
    const auto& rec = it->second.rec;
    auto n = named_.find({rec.ray_namespace(), rec.name()});
    if (n != named_.end() && n->second == rec.actor_id()) named_.erase(n);
    if (store_) {
      if (auto s = store_->Delete(StoreKind::kActor, rec.actor_id()); !s.ok()) {
        TORUS_LOG(ERROR) << "actor " << rec.actor_id() << " not deleted from the head's state: " << s.message();
      }
    }
    actors_.erase(it);
  }
}

void ActorDirectory::SaveLocked(const ActorEntry& a) {
  if (a.rec.state() == rpc::ActorRecord::DEAD && (dead_order_.empty() || dead_order_.back() != a.rec.actor_id())) {
    dead_order_.push_back(a.rec.actor_id());
  }
  if (!store_) return;
  rpc::DurableActor d;
  *d.mutable_rec() = a.rec;
  *d.mutable_spec() = a.spec;
  d.set_no_restart(a.no_restart);
  if (auto s = store_->Put(StoreKind::kActor, a.rec.actor_id(), d.SerializeAsString()); !s.ok()) {
    TORUS_LOG(ERROR) << "actor " << a.rec.actor_id() << " not saved: " << s.message();
  }
}

StatusOr<size_t> ActorDirectory::RestoreLocked(const std::vector<std::pair<std::string, std::string>>& records) {
  std::vector<rpc::DurableActor> parsed;
  for (const auto& [id, bytes] : records) {
    rpc::DurableActor d;
    if (!d.ParseFromString(bytes) || d.rec().actor_id() != id) {
      return Internal("the record of actor " + id + " is garbled");
    }
    parsed.push_back(std::move(d));
  }
  for (auto& d : parsed) {
    const std::string id = d.rec().actor_id();
    std::map<std::string, std::string> sel;
    for (const auto& t : d.spec().label_selector()) sel[t.key()] = t.expr();
    auto terms = ParseLabelSelector(sel);
    ActorEntry& a = actors_[id];
    a.rec = d.rec();
    a.spec = d.spec();
    a.no_restart = d.no_restart();
    if (terms.ok()) a.selector = *terms;
    // A placement in flight when the head stopped is tried again.
    if (a.rec.state() == rpc::ActorRecord::PENDING || a.rec.state() == rpc::ActorRecord::RESTARTING) {
      a.resume_node = a.rec.node_id();  // a placement in flight when the head stopped: that node first
      a.rec.set_node_id("");
    }
    if (!a.rec.name().empty() && a.rec.state() != rpc::ActorRecord::DEAD) {
      named_[{a.rec.ray_namespace(), a.rec.name()}] = id;
    }
    if (a.rec.state() == rpc::ActorRecord::DEAD) dead_order_.push_back(id);
  }
  resume_grace_ = !parsed.empty();
  return parsed.size();
}

std::set<std::string> ActorDirectory::NodesInUseLocked() const {
  std::set<std::string> out;
  for (const auto& [id, a] : actors_) {
    if (a.rec.state() != rpc::ActorRecord::DEAD && !a.rec.node_id().empty()) {
      out.insert(a.rec.node_id());
    }
  }
  return out;
}

}  // namespace torus
