#include "node/leases.h"

#include <signal.h>

#include <algorithm>
#include <iterator>
#include <set>

#include "common/ids.h"
#include "common/logging.h"
#include "common/rpc.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;
// A request spilled here that still waits may spill again after this long (never sooner, so a
// request cannot bounce between nodes faster than this).
constexpr auto kRespillAfter = std::chrono::milliseconds(1000);

std::string Key(const rpc::LeaseRequest& r) { return WorkerPool::JobKey(r.job_id(), r.runtime_key()); }

}  // namespace

grpc::Status LeaseScheduler::Request(grpc::ServerContext* ctx, const rpc::LeaseRequest& req,
                                     rpc::LeaseReply* reply) {
  auto p = std::make_shared<PendingLease>();
  p->req = req;
  if (auto s = ValidateResourceSet(req.resources(), "lease request resources"); !s.ok()) {
    SetError(reply->mutable_error(), InvalidArgument(s.message()));
    return grpc::Status::OK;
  }
  p->res = FromProto(req.resources());
  if (req.label_selector_size() > 0) {
    std::map<std::string, std::string> sel;
    for (const auto& t : req.label_selector()) sel[t.key()] = t.expr();
    auto terms = ParseLabelSelector(sel);
    if (!terms.ok()) {
      SetError(reply->mutable_error(), InvalidArgument(terms.status().message()));
      return grpc::Status::OK;
    }
    p->selector = *terms;
  }
  for (auto it = p->res.begin(); it != p->res.end();) {
    it = it->second <= 0 ? p->res.erase(it) : std::next(it);
  }
  MutexLock lock(st_.mu);
  if (st_.stopping) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "node is shutting down");
  pending_.push_back(p);
  ScheduleLocked();
  while (!p->done) {
    st_.cv.WaitFor(lock, std::chrono::milliseconds(200));
    if (!p->done && ctx->IsCancelled()) {
      // The requester went away: give back what was set aside for it.
      GiveBackLocked(*p, Status::Ok());
      pending_.remove(p);
      ScheduleLocked();
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

void LeaseScheduler::Return(const std::string& lease_id, bool worker_dead) {
  MutexLock lock(st_.mu);
  if (EndLeaseLocked(lease_id, worker_dead)) ScheduleLocked();
}

void LeaseScheduler::Blocked(const std::string& worker_id, bool blocked) {
  MutexLock lock(st_.mu);
  Worker* found = st_.pool.Find(worker_id);
  if (!found) return;
  Worker& w = *found;
  if (w.state != WorkerState::kLeased && w.state != WorkerState::kActor) return;
  if (blocked && !w.hold.blocked) {
    st_.ledger.Block(&w.hold);
    ScheduleLocked();
  } else if (!blocked) {
    st_.ledger.Unblock(&w.hold);  // may go below zero briefly: the task resumes regardless
  }
}

bool LeaseScheduler::AnyNodeCouldFit(const ResourceMap& res, const LabelSelectorTerms& selector) const {
  if (Fits(res, st_.ledger.total()) && MatchesLabels(selector, labels_)) return true;
  return peers_.AnyCouldFit(res, selector);
}

bool LeaseScheduler::TakeFromBundle(PendingLease& p, std::string* error) {
  switch (st_.ledger.TakeFromBundle(p.req.placement_group_id(), p.req.bundle_index(), p.res, &p.hold, error)) {
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

bool LeaseScheduler::TrySpillback(PendingLease& p) {
  // Spilled here already: it waits its turn, unless it has waited a while and another node has
  // room for it now (then this node's queue is the wrong place, e.g. its workers are stuck).
  bool respill = p.req.spilled();
  if (respill && Clock::now() - p.queued_at < kRespillAfter) return false;
  // Prefer a node that can run it now; else, when this node could never run it, one that could.
  bool local_feasible = respill || (Fits(p.res, st_.ledger.total()) && MatchesLabels(p.selector, labels_));
  auto target = peers_.Pick(p.res, p.selector, /*or_capacity=*/!local_feasible);
  if (!target) return false;
  SpillTo(p, *target);
  return true;
}

void LeaseScheduler::SpillTo(PendingLease& p, const PeerView::Target& target) {
  p.reply.set_spillback_node_address(target.address);
  p.reply.set_spillback_node_id(target.node_id);
  p.done = true;
  // Optimistically charge the view so a burst does not all go to the same node.
  peers_.Charge(target.node_id, p.res);
}

bool LeaseScheduler::HoldResourcesLocked(PendingLease& p, bool* answered) {
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
  if (p.req.spread() && !p.req.spilled() && MatchesLabels(p.selector, labels_)) {
    // SPREAD: to another node when it has more room for the request than this one.
    if (auto target = peers_.PickRoomier(p.res, p.selector, st_.ledger.available())) {
      SpillTo(p, *target);
      *answered = true;
      return false;
    }
  }
  if (MatchesLabels(p.selector, labels_) && st_.ledger.TakeFromNode(p.res, &p.hold)) {
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
    if (p.req.report_infeasible()) {  // the submitter warns its user, then asks again to wait
      p.reply.set_infeasible(true);
      p.done = true;
      *answered = true;
    }
  }
  return false;
}

std::string LeaseScheduler::LeaseWorkerKey(const PendingLease& p) const {
  std::string k = WorkerPool::HoldKey(Key(p.req), p.hold);
  return p.hold.bundle >= 0 ? st_.ledger.BundleEnvKey(k, p.hold.pg_id, p.hold.bundle) : k;
}

void LeaseScheduler::GrantLocked(PendingLease& p, Worker& w) {
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
  p.reply.set_node_id(node_id_);
  p.done = true;
}

bool LeaseScheduler::StartNeededWorkersLocked(const std::map<std::string, WorkerNeed>& need) {
  bool any_done = false;
  for (const auto& [key, n] : need) {
    const PendingLease& e = *n.example;
    WorkerSpawn spawn;
    spawn.job_id = e.req.job_id();
    spawn.exe = e.req.executable();
    spawn.command.assign(e.req.worker_command().begin(), e.req.worker_command().end());
    spawn.code_path.assign(e.req.code_search_path().begin(), e.req.code_search_path().end());
    spawn.chips = e.hold.chips;
    spawn.gpus = Ledger::GpuIds(e.hold);
    if (e.hold.bundle >= 0) spawn.bundle = st_.ledger.FindBundle(e.hold.pg_id, e.hold.bundle);
    spawn.env_vars = &e.req.env_vars();
    for (int i = st_.pool.Starting(key); i < n.count; ++i) {
      if (auto w = st_.pool.Start(key, spawn); !w.ok()) {
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

void LeaseScheduler::ScheduleLocked() {
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
    if (Worker* w = st_.pool.FindIdle(wkey)) {
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
  if (any_done) st_.cv.NotifyAll();
}

bool LeaseScheduler::EndLeaseLocked(const std::string& lease_id, bool worker_dead) {
  auto it = worker_by_lease_.find(lease_id);
  if (it == worker_by_lease_.end()) return false;  // already returned, or the worker died
  Worker* found = st_.pool.Find(it->second);
  worker_by_lease_.erase(it);
  if (!found) return false;
  Worker& w = *found;
  st_.ledger.Return(&w.hold);
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

void LeaseScheduler::UngrantLocked(PendingLease& p) {
  TORUS_LOG(INFO) << "lease " << p.reply.lease_id() << " of worker " << p.reply.worker_id()
                  << " granted as its requester went away; taken back";
  GiveBackLocked(p, Status::Ok());
  ScheduleLocked();
}

void LeaseScheduler::GiveBackLocked(PendingLease& p, const Status& why) {
  if (p.reply.granted()) {
    EndLeaseLocked(p.reply.lease_id(), false);  // the worker holds what the grant gave
  } else {
    st_.ledger.Return(&p.hold);
  }
  p.done = true;
  if (!why.ok()) SetError(p.reply.mutable_error(), why);
}

void LeaseScheduler::FailGroupLocked(const std::string& pg_id) {
  for (auto& p : pending_) {
    if (p->req.placement_group_id() == pg_id && !p->done) {
      GiveBackLocked(*p, NotFound("placement group " + pg_id + " was removed"));
    }
  }
}

void LeaseScheduler::FailAllLocked(const Status& why) {
  for (auto& p : pending_) {
    if (!p->done) GiveBackLocked(*p, why);
  }
}

std::vector<LeaseAudit::Question> LeaseScheduler::AuditDue(std::chrono::milliseconds check_age) {
  std::vector<LeaseAudit::Question> questions;
  if (st_.stopping) return questions;
  MutexLock lock(st_.mu);
  auto now = Clock::now();
  for (auto& [id, w] : st_.pool.workers()) {
    if (w->state == WorkerState::kLeased && !w->lease_in_use && !w->address.empty() &&
        now - w->leased_at >= check_age) {
      questions.push_back({id, w->address, w->lease_id});
    }
  }
  // Queued requests that have waited may spill again (TrySpillback), and only time tells.
  if (!pending_.empty()) ScheduleLocked();
  return questions;
}

void LeaseScheduler::AuditAnswered(const LeaseAudit::Question& q, rpc::CheckLeaseReply::Use use,
                                   std::chrono::milliseconds check_age) {
  MutexLock lock(st_.mu);
  Worker* w = st_.pool.Find(q.worker_id);
  if (!w || w->lease_id != q.lease_id) return;
  if (use == rpc::CheckLeaseReply::IN_USE) {
    w->lease_in_use = true;
  } else if (use == rpc::CheckLeaseReply::REVOKED) {
    TORUS_LOG(WARNING) << "took back lease " << q.lease_id << " of worker " << q.worker_id
                       << ": its holder never used it within " << check_age.count()
                       << " ms (the grant's reply was lost)";
    EndLeaseLocked(q.lease_id, false);
    ScheduleLocked();
  }
}

std::vector<rpc::PendingDemand> LeaseScheduler::PendingDemandsLocked() const {
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

void LeaseScheduler::FillHeartbeatLocked(rpc::HeartbeatRequest* req) {
  for (auto& d : PendingDemandsLocked()) *req->add_pending() = d;
  req->set_view_version(view_version_);
  req->set_want_view(!pending_.empty());
}

void LeaseScheduler::ApplyView(const rpc::HeartbeatReply& reply) {
  MutexLock lock(st_.mu);
  if (reply.view_delta()) {
    peers_.ApplyDelta(reply);
  } else {
    rpc::ListReply snapshot;
    if (snapshot.ParseFromString(reply.view_snapshot())) peers_.ApplySnapshot(snapshot);
  }
  view_version_ = reply.view_version();
  ScheduleLocked();
}

}  // namespace torus
