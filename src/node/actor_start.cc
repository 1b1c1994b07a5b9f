#include "node/actor_start.h"

#include <signal.h>

#include <chrono>

#include "common/env_key.h"
#include "common/logging.h"
#include "common/rpc.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;

// The same key as a lease's worker key for this job and command (leases.cc).
std::string RuntimeKey(const rpc::StartActorRequest& req) {
  std::string key;
  if (req.worker_command_size()) {
    key = CommandKey(req.worker_command());
  } else {
    key = req.code_search_path_size() ? "code:" : "exe:";
    key += req.executable();
    for (const auto& p : req.code_search_path()) key += ":" + p;
  }
  return WorkerPool::JobKey(req.creation().job_id(), key + EnvVarsKey(req.creation().env_vars()));
}

// The live worker that hosts (or is being made to host) `actor_id`, or null.
Worker* ActorWorker(const WorkerPool& pool, const std::string& actor_id) {
  for (const auto& [id, w] : pool.workers()) {
    if (w->actor_id == actor_id && w->state == WorkerState::kActor && w->pid > 0 && !w->kill_requested) {
      return w.get();
    }
  }
  return nullptr;
}
}  // namespace

void ActorStarter::Start(const rpc::StartActorRequest& req, rpc::StartActorReply* reply) {
  if (auto s = ValidateResourceSet(req.resources(), "actor resources"); !s.ok()) {
    SetError(reply->mutable_error(), StatusCode::kInvalidArgument, s.message());
    return;
  }
  ResourceMap res = FromProto(req.resources());
  std::string key = RuntimeKey(req);
  std::string worker_id, worker_address;
  {
    MutexLock lock(st_.mu);
    if (AnswerFromExistingLocked(lock, req.creation().actor_id(), reply)) return;
    Hold hold;
    if (auto s = st_.ledger.TakeForActor(req.placement_group_id(), req.bundle_index(), res, &hold); !s.ok()) {
      SetError(reply->mutable_error(), s.code(), s.message());
      return;
    }
    key = WorkerPool::HoldKey(key, hold);
    if (hold.bundle >= 0) key = st_.ledger.BundleEnvKey(key, hold.pg_id, hold.bundle);
    Worker* w = WorkerLocked(lock, req, key, hold, reply);
    if (!w) return;
    w->state = WorkerState::kActor;
    w->actor_id = req.creation().actor_id();
    w->actor_ready = false;
    w->hold = std::move(hold);
    st_.pool.WarmTaken();  // it may have been a warm one: the node's heartbeat refills
    worker_id = w->id;
    worker_address = w->address;
  }
  RunConstructor(req, worker_id, worker_address, reply);
}

Worker* ActorStarter::WorkerLocked(MutexLock& lock, const rpc::StartActorRequest& req,
                                   const std::string& key, Hold& hold, rpc::StartActorReply* reply) {
  if (Worker* w = st_.pool.FindIdle(key)) return w;
  if (Worker* w = st_.pool.ClaimStarting(key, req.creation().actor_id())) {
    return WaitRegistered(lock, w->id, hold, reply);
  }
  // A worker started for this actor alone: task leases never take it meanwhile.
  WorkerSpawn spawn;
  spawn.job_id = req.creation().job_id();
  spawn.exe = req.executable();
  spawn.command.assign(req.worker_command().begin(), req.worker_command().end());
  spawn.code_path.assign(req.code_search_path().begin(), req.code_search_path().end());
  spawn.chips = hold.chips;
  spawn.gpus = Ledger::GpuIds(hold);
  spawn.reserved_for = req.creation().actor_id();
  if (hold.bundle >= 0) spawn.bundle = st_.ledger.FindBundle(hold.pg_id, hold.bundle);
  spawn.env_vars = &req.creation().env_vars();
  auto started = st_.pool.Start(key, spawn);
  if (!started.ok()) return Fail(hold, reply, StatusCode::kInternal, started.status().message());
  return WaitRegistered(lock, (*started)->id, hold, reply);
}

Worker* ActorStarter::WaitRegistered(MutexLock& lock, std::string id, Hold& hold,
                                     rpc::StartActorReply* reply) {
  auto deadline = Clock::now() + std::chrono::seconds(60);
  while (true) {
    Worker* w = st_.pool.Find(id);  // the worker may exit (and leave the pool) while we wait
    if (!w || w->pid <= 0) {
      return Fail(hold, reply, StatusCode::kUnavailable,
                  "the actor's worker process exited before it registered (see its log)");
    }
    if (w->state == WorkerState::kIdle) {
      w->reserved_for.clear();
      return w;
    }
    if (st_.stopping || !st_.cv.WaitUntil(lock, deadline)) {
      return Fail(hold, reply, StatusCode::kUnavailable, "actor worker did not start within 60 s");
    }
  }
}

bool ActorStarter::AnswerFromExistingLocked(MutexLock& lock, const std::string& actor_id,
                                            rpc::StartActorReply* reply) {
  Worker* w = ActorWorker(st_.pool, actor_id);
  while (w && !w->actor_ready && !st_.stopping) {
    st_.cv.WaitUntil(lock, Clock::now() + std::chrono::milliseconds(200));
    w = ActorWorker(st_.pool, actor_id);
  }
  if (!w || !w->actor_ready) return false;
  reply->set_worker_id(w->id);
  reply->set_worker_address(w->address);
  reply->set_ok(true);
  return true;
}

Worker* ActorStarter::Fail(Hold& hold, rpc::StartActorReply* reply, StatusCode code,
                           const std::string& why) {
  st_.ledger.Return(&hold);
  SetError(reply->mutable_error(), code, why);
  return nullptr;
}

void ActorStarter::RunConstructor(const rpc::StartActorRequest& req, const std::string& worker_id,
                                  const std::string& worker_address, rpc::StartActorReply* reply) {
  auto stub = rpc::CoreWorker::NewStub(GetChannel(worker_address));
  auto cctx = NewContext(token_);
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
    SetError(reply->mutable_error(), StatusCode::kWorkerDied,
             "actor worker died while running the constructor" +
                 (st.ok() ? std::string() : ": " + st.error_message()));
    return;
  }
  const auto& r = results.results(0);
  if (r.is_error()) {
    *reply->mutable_error() = r.error();
    MutexLock lock(st_.mu);
    Worker* w = st_.pool.Find(worker_id);
    if (w && w->pid > 0) {
      w->kill_requested = true;
      kill(w->pid, SIGKILL);
    }
    return;
  }
  MutexLock lock(st_.mu);
  if (Worker* w = st_.pool.Find(worker_id)) w->actor_ready = true;
  st_.cv.NotifyAll();
  reply->set_ok(true);
}

}  // namespace torus
