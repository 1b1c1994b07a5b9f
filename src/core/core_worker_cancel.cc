// CoreWorker: cancelling tasks (Ray's cancel), the submitter's side and the worker's (the
// CancelTask handler, cancelling what a task submitted). See core_worker.h.
#include "core/core_worker.h"

#include <algorithm>

#include "common/rpc.h"
#include "common/work_queue.h"
#include "core/conn.h"
#include "core/task_record.h"
#include "proto/torus.grpc.pb.h"
#include "torus/api/exceptions.h"

namespace torus::core {

std::string CoreWorker::CancelMessage(const TaskRecord& t) {
  return "task " + t.spec.name() + " (" + t.spec.task_id() + ") was cancelled";
}

namespace {
// Ray's answer, and its reason: killing an actor's worker would kill the actor (ray.kill does).
constexpr const char* kNoForceOnActorCalls =
    "force=True is not supported for actor tasks (ray.kill() ends the actor).";
}  // namespace

bool CoreWorker::CancelUnsent(const std::string& object_id, bool force) {
  auto drop = [&](std::deque<std::shared_ptr<TaskRecord>>& q) {
    for (auto it = q.begin(); it != q.end(); ++it) {
      if (!IsReturnOf((*it)->spec, object_id)) continue;
      auto t = *it;
      q.erase(it);
      FailTask(*t, StatusCode::kCancelled, CancelMessage(*t));
      return true;
    }
    return false;
  };
  // Not sent yet: queued for a lease, or an actor call waiting for its actor.
  for (auto& [key, q] : queues_) {
    if (drop(q->tasks)) return true;
  }
  for (auto& [id, a] : actors_) {
    if (force && std::any_of(a->waiting.begin(), a->waiting.end(),
                             [&](const auto& t) { return IsReturnOf(t->spec, object_id); })) {
      throw internal::RayInvalidArgumentException(kNoForceOnActorCalls);
    }
    if (drop(a->waiting)) return true;
  }
  // Waiting for its arguments: it fails now (its arguments are not waited for).
  std::shared_ptr<TaskRecord> found;
  for (auto& [dep, t] : waiting_on_) {
    if (IsReturnOf(t->spec, object_id) && !t->cancelled) {
      found = t;
      break;
    }
  }
  if (!found) return false;
  found->cancelled = true;
  if (found->actor_id.empty()) {  // an actor call also waits in its actor's queue (dropped above)
    for (auto it = waiting_on_.begin(); it != waiting_on_.end();) {
      it = it->second == found ? waiting_on_.erase(it) : std::next(it);
    }
    FailTask(*found, StatusCode::kCancelled, CancelMessage(*found));
  }
  return true;
}

CoreWorker::RunningTask CoreWorker::CancelRunning(const std::string& object_id, bool force) {
  // Its value is dropped when it comes (TaskCancelledError).
  for (auto& c : conns_) {
    for (auto& [n, t] : c->in_flight) {
      if (!IsReturnOf(t->spec, object_id)) continue;
      if (force && !c->actor_id.empty()) {
        throw internal::RayInvalidArgumentException(kNoForceOnActorCalls);
      }
      t->cancelled = true;
      return {true, c->address(), t->spec.task_id(), c->worker_id, c->node_address};
    }
  }
  return {};
}

void CoreWorker::SendCancelTask(const std::string& address, const std::string& task,
                                bool recursive, bool force, int timeout_ms) {
  rpc::CancelTaskRequest req;
  req.set_task_id(task);
  req.set_recursive(recursive);
  req.set_force(force);
  rpc::Empty e;
  auto ctx = NewContext(opts_.token, timeout_ms);
  (void)rpc::CoreWorker::NewStub(GetChannel(address))->CancelTask(ctx.get(), req, &e);
}

bool CoreWorker::Cancel(const std::string& object_id, bool force, bool recursive) {
  RunningTask r;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (CancelUnsent(object_id, force)) return true;
    r = CancelRunning(object_id, force);
    if (!r.found) return refs_.Find(object_id) != nullptr;
  }
  if (!force) {
    // The worker is asked to interrupt it (and what it submitted, with recursive).
    rpc_work_->Post([this, r, recursive] {
      SendCancelTask(r.worker_address, r.task_id, recursive, false, 5000);
    });
    return true;
  }
  // force and recursive: the worker cancels what the task submitted, with force, before it is
  // killed (their owner dies with it; they would run on, their results unwanted).
  if (recursive) SendCancelTask(r.worker_address, r.task_id, true, true, 3000);
  rpc::KillWorkerRequest req;
  req.set_worker_id(r.worker_id);
  req.set_force(true);
  rpc::Empty e;
  auto ctx = NewContext(opts_.token, 5000);
  (void)NodeStub(r.node_address)->KillWorker(ctx.get(), req, &e);
  return true;
}

grpc::Status CoreWorker::CancelTask(grpc::ServerContext* ctx, const rpc::CancelTaskRequest* req,
                                    rpc::Empty*) {
  if (auto s = CheckToken(ctx, opts_.token); !s.ok()) return s;
  if (task_executor_ && !req->force()) task_executor_->Interrupt(req->task_id());
  if (req->recursive()) CancelChildren(req->task_id(), req->force());
  return grpc::Status::OK;
}

void CoreWorker::CancelChildren(const std::string& parent_task, bool force) {
  std::vector<std::string> children;  // their first return ids, each once
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto take = [&](const std::shared_ptr<TaskRecord>& t) {
      if (t->parent_task == parent_task && !t->cancelled) children.push_back(t->spec.return_id());
    };
    for (auto& [key, q] : queues_) {
      for (auto& t : q->tasks) take(t);
    }
    for (auto& [id, a] : actors_) {
      for (auto& t : a->waiting) take(t);
    }
    for (auto& [dep, t] : waiting_on_) take(t);
    for (auto& c : conns_) {
      for (auto& [n, t] : c->in_flight) take(t);
    }
  }
  std::sort(children.begin(), children.end());
  children.erase(std::unique(children.begin(), children.end()), children.end());
  for (const auto& id : children) Cancel(id, force, /*recursive=*/true);
}

}  // namespace torus::core
