// CoreWorker's actor calls: creating actors through the head, one ordered queue and stream per
// actor, resolving (and re-resolving after a restart) where an actor lives, failing calls of a
// dead one.

#include "core/core_worker.h"

#include <cxxabi.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include "common/env_key.h"
#include "common/ids.h"
#include "common/labels.h"
#include "common/lane.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/thread_annotations.h"
#include "common/work_queue.h"
#include "core/conn.h"
#include "core/log_forwarder.h"
#include "core/task_record.h"
#include "core/throw_status.h"
#include "tpu/chip_visibility.h"
#include "torus/api/exceptions.h"
#include "torus/api/runtime_env.h"
#include "torus/api/serializer.h"

namespace torus::core {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

// ------------------------------------------------------------------------------- actors

std::string CoreWorker::CreateActor(const std::string& factory_name,
                                    std::vector<internal::TaskArg> args,
                                    const internal::ActorOptions& options) {
  rpc::CreateActorRequest req;
  req.set_placement_group_id(options.placement_group_id);
  req.set_bundle_index(options.bundle_index);
  req.set_spread(options.spread && options.placement_group_id.empty());
  for (const auto& [k, v] : options.label_selector) {
    auto* term = req.add_label_selector();
    term->set_key(k);
    term->set_expr(v);
  }
  std::string actor_id = RandomHex(16);
  rpc::TaskSpec* spec = req.mutable_creation();
  spec->set_actor_id(actor_id);
  spec->set_actor_creation(true);
  spec->set_function(factory_name);
  const bool python = options.language == internal::Language::kPython;
  if (python) spec->set_language(rpc::PYTHON);
  spec->set_owner_address(address_);
  spec->set_driver_address(DriverAddress());
  spec->set_job_id(JobId());
  spec->set_max_concurrency(std::max(1, options.max_concurrency));
  spec->set_task_id(actor_id);
  spec->set_placement_group_id(options.placement_group_id);
  spec->set_capture_child_tasks(options.capture_child_tasks && !options.placement_group_id.empty());
  std::string ns = options.ray_namespace.empty() ? GetNamespace() : options.ray_namespace;
  spec->set_ray_namespace(ns);
  SetJobConfig(options.serialized_runtime_env, spec);
  // Refs inside constructor arguments stay held by this process for as long as it lives: a
  // restarted actor unpacks the same arguments again.
  std::vector<std::string> ctor_nested;
  for (auto& a : args) {
    for (auto& n : a.nested_ids) ctor_nested.push_back(std::move(n));
    a.nested_ids.clear();
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (const auto& n : ctor_nested) refs_.Entry(n).local_refs++;
    std::vector<std::string> refs;
    PrepareArgs(args, spec, &refs);
    // Constructor arguments must be values the node can hand over: resolve refs now.
    lock.unlock();
    for (int i = 0; i < spec->args_size(); ++i) {
      rpc::Arg* a = spec->mutable_args(i);
      if (!a->is_ref()) continue;
      auto bufs = Get({a->ref_id()}, -1);
      a->set_is_ref(false);
      a->set_value(std::string(bufs[0]->data(), bufs[0]->size()));
    }
    lock.lock();
    for (auto& id : refs) {
      refs_.ReleaseIfUnused(id);
    }
  }
  req.set_name(options.name);
  req.set_ray_namespace(ns);
  req.set_max_restarts(options.max_restarts);
  req.set_detached(options.lifetime_set ? options.detached : spec->default_detached());
  req.set_executable(executable_);
  if (python) {
    for (const auto& a : python_command_) req.add_worker_command(a);
  } else {
    for (const auto& p : opts_.code_search_path) req.add_code_search_path(p);
  }
  if (auto it = options.resources.find("TPU"); it != options.resources.end()) {
    if (auto st = tpu::ValidateTaskTpuRequest(it->second); !st.ok()) ThrowStatus(st);
  }
  ResourceMap res(options.resources.begin(), options.resources.end());  // validated: rounded to units
  ToProto(res, req.mutable_resources());
  *spec->mutable_resources() = req.resources();  // what the actor holds, for its runtime context
  head_->CreateActor(req);
  return actor_id;
}

std::string CoreWorker::SubmitActorTask(const std::string& actor_id, const std::string& method_name,
                                        std::vector<internal::TaskArg> args,
                                        const internal::TaskOptions& options) {
  auto t = std::make_shared<TaskRecord>();
  t->actor_id = actor_id;
  t->parent_task = CurrentTaskId();
  // Retries of a call whose actor died and restarts (max_task_retries; negative: forever).
  t->max_retries = RetryLimit(options.max_retries);
  rpc::TaskSpec& spec = t->spec;
  spec.set_function(method_name);
  if (!options.name.empty() && options.name != method_name) spec.set_name(options.name);  // "Class.method"
  if (options.language == internal::Language::kPython) spec.set_language(rpc::PYTHON);
  spec.set_actor_id(actor_id);
  spec.set_owner_address(address_);
  spec.set_driver_address(DriverAddress());
  spec.set_caller_id(opts_.worker_id);
  spec.set_job_id(JobId());
  spec.set_ray_namespace(GetNamespace());
  SetJobConfig("", &spec, /*with_env=*/false);  // the actor's process has its own env_vars
  Outbox out;  // flushed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) throw internal::RayException("ray::Shutdown() has been called");
  std::string rid = NewReturnObject(&spec, options.num_returns);
  std::vector<std::string> refs;
  PrepareArgs(args, &spec, &refs);
  TrackArgs(t, refs);
  if (t->missing == 0) FillResolvedArgs(*t);
  auto& a = actors_[actor_id];
  if (!a) {
    a = std::make_unique<ActorQueue>();
    a->actor_id = actor_id;
  }
  spec.set_seq(a->next_seq++);
  SetTaskState(spec, t->missing ? rpc::TaskInfo::PENDING_ARGS : rpc::TaskInfo::PENDING);
  a->waiting.push_back(t);
  PumpActor(*a, &out);
  return rid;
}

void CoreWorker::FailActorCalls(const std::string& actor_id, const std::string& worker_id,
                                const std::vector<std::shared_ptr<TaskRecord>>& lost,
                                const std::string& why) {
  std::string cause = "the actor's worker stopped (" + why + ")";
  rpc::GetActorRequest req;
  req.set_actor_id(actor_id);
  req.set_wait_alive_ms(2000);
  req.set_not_worker_id(worker_id);
  bool restarted = false;
  if (auto reply = head_->GetActor(req); reply.ok() && reply->found()) {
    const auto& a = reply->actor();
    // Not DEAD: restarting, or placed elsewhere, or the head has not heard of the end yet.
    restarted = a.state() != rpc::ActorRecord::DEAD;
    if (!restarted) {
      cause = a.death_cause();
    } else if (a.worker_id() != worker_id) {
      cause = "the actor's worker died and the actor was restarted";
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(actor_id);
  // Calls with retries left (max_task_retries) go to the restarted actor again, ahead of the
  // calls queued since, in their submission order; the others fail.
  std::vector<std::shared_ptr<TaskRecord>> replay;
  for (auto& t : lost) {
    if (restarted && it != actors_.end() && !t->cancelled && t->spec.attempt() < t->max_retries) {
      replay.push_back(NextAttempt(*t));
      continue;
    }
    FailTask(*t, StatusCode::kActorDied, "actor " + actor_id + " died while running " +
                                             t->spec.function() + ": " + cause);
  }
  if (it != actors_.end()) {
    std::sort(replay.begin(), replay.end(),
              [](const auto& a, const auto& b) { return a->spec.seq() < b->spec.seq(); });
    auto& waiting = it->second->waiting;
    waiting.insert(waiting.begin(), replay.begin(), replay.end());
    PumpActor(*it->second);
  }
  cv_.notify_all();
}

void CoreWorker::PumpActor(ActorQueue& a, Outbox* out) {
  if (a.dead) {
    for (auto& t : a.waiting) {
      FailTask(*t, StatusCode::kActorDied, "actor " + a.actor_id + " is dead: " + a.death_cause);
    }
    a.waiting.clear();
    cv_.notify_all();
    return;
  }
  if (!a.conn) {
    if (!a.resolving && !a.waiting.empty()) {
      a.resolving = true;
      SpawnTracked([this, id = a.actor_id, w = a.lost_worker] { ResolveActor(id, w); });
    }
    return;
  }
  // Submission order: stop at the first call whose arguments are not ready yet.
  bool sent = false;
  uint64_t last = 0;
  while (!a.waiting.empty() && a.waiting.front()->missing == 0) {
    auto t = std::move(a.waiting.front());
    a.waiting.pop_front();
    t->conn = a.conn;
    last = TaskCounterOf(t->spec.task_id());
    a.conn->in_flight[last] = t;
    SetTaskState(t->spec, rpc::TaskInfo::RUNNING, a.conn);
    a.conn->Enqueue(std::move(t));
    sent = true;
  }
  if (!sent) return;
  if (out) {
    out->Add(a.conn->shared_from_this(), a.conn->in_flight.size() == 1 && a.waiting.empty(),
             last);
  } else {
    a.conn->Flush(/*direct=*/false);
  }
}

void CoreWorker::ResolveActor(const std::string& actor_id, const std::string& lost_worker) {
  // The head may still name the worker whose connection broke: it has not heard of that
  // worker's end yet (its node reports it within a second), or the worker lives and only the
  // connection broke. Past this grace, connect to it again: a dead worker refuses at once and
  // its calls take the usual path, so no call waits on the head for ever.
  constexpr auto kSameWorkerGrace = std::chrono::seconds(10);
  const auto since = Clock::now();
  StatusOr<rpc::GetActorReply> reply = Unavailable("shutting down");
  auto placed = [&] {
    return reply->actor().state() == rpc::ActorRecord::ALIVE && !reply->actor().address().empty();
  };
  while (!shutting_down_) {
    rpc::GetActorRequest req;
    req.set_actor_id(actor_id);
    req.set_wait_alive_ms(2000);
    req.set_not_worker_id(lost_worker);
    reply = head_->GetActor(req);
    if (!reply.ok() || !reply->found() || reply->actor().state() == rpc::ActorRecord::DEAD) break;
    if (placed() && (reply->actor().worker_id() != lost_worker ||
                     Clock::now() - since > kSameWorkerGrace)) {
      break;
    }
  }
  std::shared_ptr<Conn> conn;
  if (reply.ok() && reply->found() && placed() && !shutting_down_) {
    conn = std::make_shared<Conn>(static_cast<Conn::Listener*>(this), reply->actor().address(),
                                  opts_.token);
    conn->actor_id = actor_id;
    conn->worker_id = reply->actor().worker_id();
    conn->node_id = reply->actor().node_id();
  }
  Outbox out;  // the waiting calls go out from this thread, after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto it = actors_.find(actor_id);
  if (it == actors_.end() || shutting_down_) return;
  ActorQueue& a = *it->second;
  a.resolving = false;
  if (conn) {
    a.conn = conn.get();
    conn->Start();  // attached: a stream that fails at once now finds this actor's queue
    conns_.push_back(std::move(conn));
  } else {
    a.dead = true;
    if (!reply.ok()) {
      a.death_cause = reply.status().message();
    } else if (!reply->found()) {
      a.death_cause = "no such actor";
    } else {
      a.death_cause = reply->actor().death_cause();
    }
  }
  PumpActor(a, &out);
}

std::string CoreWorker::CreatePlacementGroup(const internal::PlacementGroupSpec& spec) {
  return head_->CreatePlacementGroup(spec, GetNamespace(), JobId());
}

void CoreWorker::RemovePlacementGroup(const std::string& id) {
  head_->RemovePlacementGroup(id);
  // Work queued for the group's bundles can never run now.
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& [key, q] : queues_) {
    if (key.find("|pg=" + id + ":") == std::string::npos) continue;
    for (auto& t : q->tasks) FailTask(*t, StatusCode::kTaskError, "placement group " + id + " was removed");
    q->tasks.clear();
  }
  cv_.notify_all();
}

bool CoreWorker::WaitPlacementGroup(const std::string& id, int timeout_seconds) {
  return head_->WaitPlacementGroup(id, timeout_seconds);
}

internal::PlacementGroupInfo CoreWorker::GetPlacementGroupInfo(const std::string& id,
                                                               const std::string& name) {
  return head_->GetPlacementGroupInfo(id, name, GetNamespace());
}

std::vector<internal::PlacementGroupInfo> CoreWorker::GetAllPlacementGroups() {
  return head_->GetAllPlacementGroups();
}

internal::SliceQueryResult CoreWorker::QuerySlices(const std::string& topology,
                                                   const std::string& version, int chips_per_vm,
                                                   const std::string& slice_name) {
  return head_->QuerySlices(topology, version, chips_per_vm, slice_name);
}

std::string CoreWorker::GetNamedActor(const std::string& name, const std::string& ray_namespace) {
  return head_->GetNamedActor(name, ray_namespace.empty() ? GetNamespace() : ray_namespace);
}

void CoreWorker::KillActor(const std::string& actor_id, bool no_restart) {
  head_->KillActor(actor_id, no_restart);
}

void CoreWorker::ExitActor() {
  if (!task_executor_ || task_executor_->actor_id().empty()) {
    throw internal::RayException("ray::ExitActor() can only be called inside an actor method");
  }
  throw ExitActorSignal{};
}

bool CoreWorker::WasCurrentActorRestarted() {
  return task_executor_ && task_executor_->actor_restarted();
}

}  // namespace torus::core
