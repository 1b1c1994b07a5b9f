// CoreWorker's task submission: arguments and dependencies, scheduling queues, leases (with
// spillback), results, retries, cancellation, and returning idle leases.

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

constexpr auto kLeaseLinger = std::chrono::milliseconds(10);
constexpr int kMaxPipelineDepth = 64;
constexpr int kMaxLeaseRequestsInFlight = 2;
}  // namespace

// ------------------------------------------------------------------------------- submission

void CoreWorker::PrepareArgs(std::vector<internal::TaskArg>& args, rpc::TaskSpec* spec,
                             std::vector<std::string>* deps) {
  for (auto& a : args) {
    rpc::Arg* out = spec->add_args();
    // Refs inside a by-value argument are pinned like ref arguments, until the task has run:
    // the executor registers as a borrower of those it keeps.
    for (auto& n : a.nested_ids) {
      out->add_nested_ids(n);
      deps->push_back(std::move(n));
    }
    if (!a.is_ref && a.value.size() >= kInlineLimit) {
      // Large by-value arguments go through the object store like any large value.
      mu_.unlock();
      std::string id;
      try {
        id = Put(std::move(a.value));
      } catch (...) {
        mu_.lock();
        throw;
      }
      mu_.lock();
      a.is_ref = true;
      a.ref_id = id;
      refs_.Entry(id).local_refs--;  // the task's pin below keeps it alive instead
    }
    if (!a.is_ref) {
      out->set_value(std::move(a.value));
      continue;
    }
    out->set_is_ref(true);
    out->set_ref_id(a.ref_id);
    deps->push_back(a.ref_id);
  }
}

std::string CoreWorker::SubmitTask(const std::string& function_name,
                                   std::vector<internal::TaskArg> args,
                                   const internal::TaskOptions& options) {
  auto t = std::make_shared<TaskRecord>();
  t->parent_task = CurrentTaskId();
  rpc::TaskSpec& spec = t->spec;
  spec.set_function(function_name);
  spec.set_owner_address(address_);
  spec.set_driver_address(DriverAddress());
  spec.set_job_id(JobId());
  spec.set_ray_namespace(GetNamespace());
  spec.set_name(options.name.empty() ? function_name : options.name);
  if (!options.placement_group_id.empty()) {
    spec.set_placement_group_id(options.placement_group_id);
    spec.set_capture_child_tasks(options.capture_child_tasks);
  }
  const bool python = options.language == internal::Language::kPython;
  if (python) spec.set_language(rpc::PYTHON);
  std::map<std::string, std::string> selector(options.label_selector.begin(),
                                              options.label_selector.end());
  std::string key = SchedulingKey(options, selector, &spec);
  if (python) key += "|py";
  t->max_retries = RetryLimit(options.max_retries);
  t->retry_exceptions = options.retry_exceptions;
  SetJobConfig(options.serialized_runtime_env, &spec);
  const std::string env_key = EnvVarsKey(spec.env_vars());  // no sharing across env_vars
  key += env_key;
  // A worker's leases are for the job of the task it runs (an actor serves several jobs).
  if (!opts_.is_driver) key += "|job=" + spec.job_id();
  t->key = key;
  Outbox out;  // flushed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  if (shutting_down_) throw internal::RayException("ray::Shutdown() has been called");
  std::string rid = NewReturnObject(&spec, options.num_returns);
  std::vector<std::string> refs;
  PrepareArgs(args, &spec, &refs);
  auto& q = queues_[key];
  if (!q) {
    q = NewSchedulingQueue(key, spec, options, selector,
                           (python ? python_runtime_key_ : runtime_key_) + env_key);
  }
  TrackArgs(t, refs);
  SetTaskState(spec, t->missing ? rpc::TaskInfo::PENDING_ARGS : rpc::TaskInfo::PENDING);
  if (t->missing == 0) {
    FillResolvedArgs(*t);
    Enqueue(t, &out);
  }
  return rid;
}

std::string CoreWorker::SchedulingKey(const internal::TaskOptions& options,
                                      const std::map<std::string, std::string>& selector,
                                      rpc::TaskSpec* spec) {
  std::string key;
  if (options.resources.empty()) {
    // The default shape {CPU: 1}: its proto and key are built once, not per task.
    static const auto* kDefault = [] {
      auto* d = new std::pair<rpc::ResourceSet, std::string>();
      ResourceMap cpu1{{"CPU", 1}};
      ToProto(cpu1, &d->first);
      d->second = ResourcesToString(cpu1);
      return d;
    }();
    *spec->mutable_resources() = kDefault->first;
    key = kDefault->second;
  } else {
    if (auto it = options.resources.find("TPU"); it != options.resources.end()) {
      if (auto st = tpu::ValidateTaskTpuRequest(it->second); !st.ok()) ThrowStatus(st);
    }
    ResourceMap res(options.resources.begin(), options.resources.end());  // validated: rounded to units
    ToProto(res, spec->mutable_resources());
    key = ResourcesToString(res);
  }
  if (!options.placement_group_id.empty()) {
    key += "|pg=" + options.placement_group_id + ":" + std::to_string(options.bundle_index);
  } else if (options.spread) {
    key += "|spread";
  }
  if (!selector.empty()) {
    auto terms = ParseLabelSelector(selector);
    if (!terms.ok()) ThrowStatus(terms.status());
    for (const auto& [k, v] : selector) key += "|" + k + "=" + v;
  }
  return key;
}

std::unique_ptr<SchedulingQueue> CoreWorker::NewSchedulingQueue(
    const std::string& key, const rpc::TaskSpec& spec, const internal::TaskOptions& options,
    const std::map<std::string, std::string>& selector, const std::string& runtime_key) {
  auto q = std::make_unique<SchedulingQueue>();
  q->key = key;
  auto& lt = q->lease_template;
  *lt.mutable_resources() = spec.resources();
  lt.set_runtime_key(runtime_key);
  *lt.mutable_env_vars() = spec.env_vars();
  lt.set_executable(executable_);
  if (spec.language() == rpc::PYTHON) {
    for (const auto& a : python_command_) lt.add_worker_command(a);
  } else {
    for (const auto& p : opts_.code_search_path) lt.add_code_search_path(p);
  }
  lt.set_job_id(spec.job_id());  // nodes give its leases workers of this job only
  lt.set_owner_address(address_);
  lt.set_description("task " + spec.function());
  lt.set_report_infeasible(true);  // the first answer says so when no node has the resources
  lt.set_placement_group_id(options.placement_group_id);
  q->spread = options.spread && options.placement_group_id.empty();
  lt.set_spread(q->spread);
  lt.set_bundle_index(options.bundle_index);
  for (const auto& [k, v] : selector) {
    auto* term = lt.add_label_selector();
    term->set_key(k);
    term->set_expr(v);
  }
  if (!options.placement_group_id.empty()) lt.set_spilled(true);  // the bundle decides: no spillback
  return q;
}

std::string CoreWorker::NewReturnObject(rpc::TaskSpec* spec, int num_returns) {
  const int n = std::max(num_returns, 1);
  std::string rid = NewObjectId(n);
  spec->set_task_id(HexOf(rid));
  spec->set_return_id(rid);
  if (n > 1) spec->set_num_returns(n);
  for (int i = 0; i < n; ++i) {
    ObjectEntry& re = refs_.Entry(i == 0 ? rid : ReturnIdOf(rid, i));
    re.owned = true;
    re.local_refs = 1;
  }
  return rid;
}

void CoreWorker::TrackArgs(const std::shared_ptr<TaskRecord>& t, const std::vector<std::string>& refs) {
  for (const auto& id : refs) {
    refs_.Pin(id);
    t->pinned.push_back(id);
  }
  WaitForArgs(t);
}

void CoreWorker::WaitForArgs(const std::shared_ptr<TaskRecord>& t) {
  // Dependencies: owned objects not yet ready hold the task back.
  const rpc::TaskSpec& spec = t->spec;
  for (int i = 0; i < spec.args_size(); ++i) {
    if (!spec.args(i).is_ref()) continue;
    const std::string& id = spec.args(i).ref_id();
    ObjectEntry* e = refs_.Find(id);
    if (e && e->owned && !e->ready) {
      t->missing++;
      waiting_on_.emplace(id, t);
    }
  }
}

void CoreWorker::FillResolvedArgs(TaskRecord& t) {
  for (int i = 0; i < t.spec.args_size(); ++i) {
    rpc::Arg* a = t.spec.mutable_args(i);
    if (!a->is_ref() || a->location_known()) continue;
    bool is_error = false;
    rpc::Error err;
    if (LocationOf(a->ref_id(), a->mutable_location(), &is_error, &err)) {
      if (is_error) {
        // A failed dependency fails the task with the same error, as in Ray.
        a->clear_location();
        continue;
      }
      a->set_location_known(true);
    }
  }
}

void CoreWorker::OnObjectReady(const std::string& id) {
  auto range = waiting_on_.equal_range(id);
  std::vector<std::shared_ptr<TaskRecord>> ready;
  for (auto it = range.first; it != range.second; ++it) {
    if (--it->second->missing == 0) ready.push_back(it->second);
  }
  waiting_on_.erase(range.first, range.second);
  for (auto& t : ready) {
    // If a dependency failed, the task fails with that error without running.
    for (const auto& a : t->spec.args()) {
      if (!a.is_ref()) continue;
      auto it = refs_.objects().find(a.ref_id());
      if (it != refs_.objects().end() && it->second.is_error) {
        rpc::TaskResult r;
        r.set_is_error(true);
        *r.mutable_error() = it->second.error;
        ReleaseTaskPins(*t);
        StoreTaskResult(t->spec, r);
        SetTaskState(t->spec, rpc::TaskInfo::FAILED, nullptr, "an argument failed: " + r.error().message());
        t.reset();
        break;
      }
    }
    if (!t) continue;
    if (t->cancelled && t->actor_id.empty()) {
      FailTask(*t, StatusCode::kCancelled, CancelMessage(*t));
      continue;
    }
    FillResolvedArgs(*t);
    if (!t->actor_id.empty()) {
      auto ait = actors_.find(t->actor_id);
      if (ait != actors_.end()) PumpActor(*ait->second);
    } else {
      Enqueue(t);
    }
  }
}

void CoreWorker::Enqueue(std::shared_ptr<TaskRecord> t, Outbox* out) {
  auto& q = *queues_[t->key];
  q.tasks.push_back(std::move(t));
  PumpQueue(q, out);
}

int CoreWorker::PipelineDepth(const SchedulingQueue& q, const std::string& function) const {
  // Short functions are pipelined to a worker (batching hides the round trip); long or unknown
  // ones, and SPREAD ones, go one per worker, so they spread over workers and nodes.
  if (q.spread) return 1;
  auto it = exec_avg_us_.find(function);
  return (it != exec_avg_us_.end() && it->second < 2000) ? kMaxPipelineDepth : 1;
}

void CoreWorker::PumpQueue(SchedulingQueue& q, Outbox* outbox) {
  // With deep pipelining a lease is topped up only once half of its window is free, and then
  // filled in one go: a sequential worker answers each batch with one result batch, so
  // refilling a few slots per returned batch would keep every batch as small as the first
  // ones for as long as the stream lives.
  std::vector<std::pair<Conn*, std::vector<std::shared_ptr<TaskRecord>>>> out;
  auto opened = [&](Conn* c) {
    for (auto& o : out) {
      if (o.first == c) return &o.second;
    }
    return static_cast<std::vector<std::shared_ptr<TaskRecord>>*>(nullptr);
  };
  while (!q.tasks.empty()) {
    int depth = PipelineDepth(q, q.tasks.front()->spec.function());
    int refill_below = depth > 1 ? depth / 2 : depth;
    Conn* best = nullptr;
    for (Conn* c : q.leases) {
      if (c->broken || c->returned || c->held) continue;
      int n = static_cast<int>(c->in_flight.size());
      if (n >= depth) continue;
      if (n >= refill_below && !opened(c)) continue;
      if (!best || c->in_flight.size() < best->in_flight.size()) best = c;
    }
    if (!best) break;
    auto t = std::move(q.tasks.front());
    q.tasks.pop_front();
    t->conn = best;
    t->stream_pos = ++best->sent;
    t->sent_at = Clock::now();
    best->in_flight[TaskCounterOf(t->spec.task_id())] = t;
    SetTaskState(t->spec, rpc::TaskInfo::RUNNING, best);
    auto* v = opened(best);
    if (!v) {
      out.emplace_back(best, std::vector<std::shared_ptr<TaskRecord>>());
      v = &out.back().second;
    }
    v->push_back(std::move(t));
  }
  for (auto& [c, ts] : out) {
    // A lone task on an idle stream with nothing else queued: the caller writes it itself.
    bool direct = ts.size() == 1 && c->in_flight.size() == 1 && q.tasks.empty();
    uint64_t first = TaskCounterOf(ts.front()->spec.task_id());
    for (auto& t : ts) c->Enqueue(std::move(t));
    if (outbox) {
      outbox->Add(c->shared_from_this(), direct, first);
    } else {
      c->Flush(/*direct=*/false);
    }
  }
  // No more requests out than tasks waiting (one more would only take a task from one already out).
  if (q.lease_requests < std::min<int64_t>(kMaxLeaseRequestsInFlight, int64_t(q.tasks.size()))) RequestLease(q);
}

void CoreWorker::RequestLease(SchedulingQueue& q) {
  q.lease_requests++;
  rpc::LeaseRequest req = q.lease_template;
  SpawnTracked([this, key = q.key, req, addr = opts_.node_address, spread = q.lease_spread++] {
    LeaseThread(key, req, addr, spread);
  });
}

void CoreWorker::LeaseThread(std::string key, rpc::LeaseRequest req, std::string node_address,
                             int spread) {
  rpc::LeaseReply reply;
  std::string error;
  const bool in_group = !req.placement_group_id().empty();
  const std::string own_node = node_address;
  for (int attempt = 0;; ++attempt) {
    Status st;
    node_address = own_node;
    if (in_group) {
      // Lease straight from the node of the bundle (waits while the group is not CREATED, e.g.
      // while a lost slice is re-granted). Its answer is final: the group is gone or wrong.
      auto node = head_->BundleNode(req.placement_group_id(), req.bundle_index(),
                                    FromProto(req.resources()), spread, shutting_down_);
      if (!node.ok()) {
        error = node.status().message();
        break;
      }
      node_address = *node;
    }
    req.set_spilled(false);
    st = RequestLeaseFrom(req, &node_address, &reply);
    error = st.message();
    // A node that cannot be reached (it died and is not yet declared dead, or restarts), or a
    // bundle not (or no longer) where the head said: the head will know better soon, and these
    // tasks never ran, so they wait for a worker rather than fail.
    const bool transient = st.code() == StatusCode::kUnavailable ||
                           (in_group && st.code() == StatusCode::kNotFound);
    if (st.ok() || !transient || shutting_down_) break;
    std::unique_lock<std::mutex> lock(mu_);
    auto& q = *queues_[key];
    if (q.tasks.empty()) {  // nothing waits for this lease any more
      q.lease_requests--;
      return;
    }
    if (attempt % 20 == 0) {
      TORUS_LOG(WARNING) << "cannot get a worker for " << q.lease_template.description() << " yet ("
                         << error << "); " << q.tasks.size() << " task(s) wait, asking again";
    }
    auto backoff = std::chrono::milliseconds(std::min(1000, 50 << std::min(attempt, 5)));
    cv_.wait_for(lock, backoff, [this] { return shutting_down_.load(); });
  }
  std::shared_ptr<Conn> conn;
  if (error.empty() && shutting_down_) {
    rpc::ReturnLeaseRequest rreq;
    rreq.set_lease_id(reply.lease_id());
    rpc::Empty e;
    auto ctx = NewContext(opts_.token, 5000);
    (void)NodeStub(node_address)->ReturnLease(ctx.get(), rreq, &e);
  }
  if (error.empty() && !shutting_down_) {
    conn = std::make_shared<Conn>(static_cast<Conn::Listener*>(this), reply.worker_address(),
                                  opts_.token);
    conn->SetLease(reply.lease_id());
    conn->key = key;
    conn->lease_id = reply.lease_id();
    conn->worker_id = reply.worker_id();
    conn->node_address = node_address;
    conn->node_id = reply.node_id();
  }
  Outbox out;  // the first tasks go out from this thread, after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  auto& q = *queues_[key];
  q.lease_requests--;
  if (shutting_down_) return;
  if (!error.empty()) {
    TORUS_LOG(ERROR) << "cannot get a worker for " << q.lease_template.description() << ": " << error;
    for (auto& t : q.tasks) FailTask(*t, StatusCode::kWorkerDied, "cannot get a worker: " + error);
    q.tasks.clear();
    cv_.notify_all();
    return;
  }
  Conn* c = conn.get();
  conns_.push_back(std::move(conn));
  q.leases.push_back(c);
  c->Start();  // attached: a stream that fails at once now finds its queue
  c->idle_since = Clock::now();
  PumpQueue(q, &out);
  WakeHousekeeping();
}

Status CoreWorker::RequestLeaseFrom(rpc::LeaseRequest& req, std::string* node_address,
                                         rpc::LeaseReply* reply) {
  // A request spilled to a node that cannot serve it waits there, and is spilled on only after
  // waiting (Node::TrySpillback), so following spillbacks needs no hop limit.
  int fallbacks = 0;
  for (int hops = 0;; ++hops) {
    if (hops > 0 && hops % 16 == 0) {
      TORUS_LOG(WARNING) << "lease request for " << req.description() << " spilled " << hops
                         << " times; still looking for a node with room";
    }
    auto stub = NodeStub(*node_address);
    auto ctx = TrackedContext();
    reply->Clear();
    auto st = stub->RequestLease(ctx.get(), req, reply);
    ReleaseContext(ctx.get());
    if (!st.ok()) {
      // A node we were spilled to that went away: ask our own node again (a few times).
      if (req.placement_group_id().empty() && *node_address != opts_.node_address &&
          !shutting_down_ && ++fallbacks <= 3 && st.error_code() != grpc::StatusCode::CANCELLED) {
        TORUS_LOG(WARNING) << "lease request to node " << *node_address << " failed ("
                           << st.error_message() << "); asking node " << opts_.node_address;
        *node_address = opts_.node_address;
        req.set_spilled(false);
        continue;
      }
      return Unavailable("lease request to node " + *node_address + " failed: " + st.error_message());
    }
    if (reply->has_error() && reply->error().code() != 0) {
      return Status(static_cast<StatusCode>(reply->error().code()), reply->error().message());
    }
    if (reply->granted()) return Status::Ok();
    if (reply->infeasible()) {  // warned; asked again, it waits at this node
      WarnInfeasible(req);
      continue;
    }
    if (!reply->spillback_node_address().empty()) {
      *node_address = reply->spillback_node_address();
      req.set_spilled(true);
      continue;
    }
    return Internal("node " + *node_address + " returned an empty lease reply");
  }
}

void CoreWorker::ReturnLease(Conn* conn, bool worker_dead) {
  rpc::ReturnLeaseRequest req;
  req.set_lease_id(conn->lease_id);
  req.set_worker_dead(worker_dead);
  rpc_work_->Post([req, addr = conn->node_address, token = opts_.token] {
    rpc::Empty e;
    auto ctx = NewContext(token, 5000);
    (void)rpc::Node::NewStub(GetChannel(addr))->ReturnLease(ctx.get(), req, &e);
  });
}

namespace {
// A Python task's raised exception, stored as its value (docs/python.md "Values": 0xC1 'E').
// Such values are small, hence inline.
bool IsExceptionValue(const rpc::ObjectLocation& v) {
  const std::string& d = v.inline_data();
  return !v.in_shm() && d.size() >= 2 && d[0] == '\xc1' && d[1] == 'E';
}

// A result with a value in a node's store (a copy that can be lost with its node).
bool StoredValue(const rpc::TaskResult& r) {
  if (r.value().in_shm()) return true;
  for (const auto& m : r.more_returns()) {
    if (m.value().in_shm()) return true;
  }
  return false;
}
}  // namespace

bool CoreWorker::OnResults(Conn* conn, rpc::ResultBatch& batch) {
  std::lock_guard<std::mutex> lock(mu_);
  SchedulingQueue* q = nullptr;
  if (conn->actor_id.empty()) {
    auto it = queues_.find(conn->key);
    if (it != queues_.end()) q = it->second.get();
  }
  if (batch.requeue_from() && q) RequeueYielded(conn, *q, batch.requeue_from());
  for (auto& r : *batch.mutable_results()) {
    auto it = conn->in_flight.find(TaskCounterOf(r.task_id()));
    if (it == conn->in_flight.end()) continue;
    auto t = it->second;
    conn->in_flight.erase(it);
    if (q && !r.is_error()) {
      double x = static_cast<double>(r.exec_us());
      auto [avg, fresh] = exec_avg_us_.try_emplace(t->spec.function(), x);
      if (!fresh) avg->second = 0.8 * avg->second + 0.2 * x;
    }
    if (t->cancelled) {
      FailTask(*t, StatusCode::kCancelled, CancelMessage(*t), &r);
      continue;
    }
    if (t->retry_exceptions && !r.is_error() && t->spec.attempt() < t->max_retries &&
        IsExceptionValue(r.value())) {
      Resubmit(*t);
      continue;
    }
    if (r.is_error() && !r.lost_object_id().empty() && q &&
        OwnerOf(r.lost_object_id()) == address_ && t->spec.attempt() < t->max_retries) {
      // An argument of ours went with its node: made again (if it can be), then the task.
      SpawnTracked([this, t, lost = r.lost_object_id(), err = r.error()] {
        RetryAfterLostArg(t, lost, err);
      });
      continue;
    }
    if (q && !r.is_error() && StoredValue(r) && !IsExceptionValue(r.value())) KeepLineage(t);
    ReleaseTaskPins(*t);
    // A Python task that raised stores the exception as its value: failed too (as in Ray's
    // state API), though its caller gets the exception from ray.get.
    const bool raised = !r.is_error() && IsExceptionValue(r.value());
    SetTaskState(t->spec, r.is_error() || raised ? rpc::TaskInfo::FAILED : rpc::TaskInfo::FINISHED, conn,
                 r.is_error() ? r.error().message() : raised ? "the task raised an exception" : "", &r);
    StoreTaskResult(t->spec, r);
  }
  if (conn->in_flight.empty()) {
    conn->idle_since = Clock::now();
    if (conn->held) {  // the blocked task is done: the worker may take tasks again
      conn->held = false;
      // Nothing was assigned to the held stream, so every task up to `sent` is done or was
      // queued again: the worker runs what comes after.
      conn->ResumeNext(conn->sent + 1);
    }
  }
  if (q) PumpQueue(*q);
  if (q && conn->in_flight.empty()) WakeHousekeeping();
  return conn->in_flight.empty();
}

void CoreWorker::RequeueYielded(Conn* conn, SchedulingQueue& q, uint64_t from) {
  // The worker's running task blocked: what was queued behind it there goes back to the front
  // of the queue, in order, without spending a retry (it never ran). Fresh records: the
  // stream's writer may still be reading the sent specs.
  conn->held = true;
  std::vector<std::shared_ptr<TaskRecord>> back;
  for (auto it = conn->in_flight.begin(); it != conn->in_flight.end();) {
    if (it->second->stream_pos >= from) {
      back.push_back(std::move(it->second));
      it = conn->in_flight.erase(it);
    } else {
      ++it;
    }
  }
  std::sort(back.begin(), back.end(), [](const auto& a, const auto& b) { return a->stream_pos > b->stream_pos; });
  for (auto& t : back) {
    auto fresh = std::make_shared<TaskRecord>(*t);
    fresh->conn = nullptr;
    SetTaskState(fresh->spec, rpc::TaskInfo::PENDING);
    q.tasks.push_front(std::move(fresh));
  }
}

void CoreWorker::ReleaseTaskPins(TaskRecord& t) {
  for (const auto& id : t.pinned) {
    refs_.Unpin(id);
  }
  t.pinned.clear();
}

void CoreWorker::FailTask(TaskRecord& t, StatusCode code, const std::string& msg,
                          const rpc::TaskResult* result) {
  SetTaskState(t.spec, rpc::TaskInfo::FAILED, nullptr, msg, result);
  ReleaseTaskPins(t);
  const int n = std::max(t.spec.num_returns(), 1);
  for (int i = 0; i < n; ++i) FailObject(ReturnIdOf(t.spec.return_id(), i), code, msg);
}

void CoreWorker::OnConnBroken(Conn* conn, const std::string& why) {
  std::vector<std::shared_ptr<TaskRecord>> lost;
  std::string worker_id, node_address, actor_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    lost = DetachConn(conn);
    worker_id = conn->worker_id;
    node_address = conn->node_address;
    actor_id = conn->actor_id;
  }
  if (shutting_down_) return;
  if (!actor_id.empty()) {
    // Actor: in-flight calls are replayed into the restarted actor while they have retries,
    // else fail; queued ones wait for a restart (or fail if the actor is dead).
    SpawnTracked([this, actor_id, worker_id, lost, why] {
      FailActorCalls(actor_id, worker_id, lost, why);
    });
    return;
  }
  if (why.find(kLeaseRevokedError) != std::string::npos) {
    // The grant reached us after the node had taken the lease back: the worker is alive and ran
    // none of these. Queue them again without spending a retry.
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& t : lost) {
      auto fresh = std::make_shared<TaskRecord>(*t);
      fresh->conn = nullptr;
      SetTaskState(fresh->spec, rpc::TaskInfo::PENDING);
      Enqueue(fresh);
    }
    return;
  }
  ReturnLease(conn, true);
  if (lost.empty()) return;
  // Ask the node how the worker ended, for the error message, then retry or fail.
  SpawnTracked([this, lost, worker_id, node_address, why] {
    RetryLostTasks(lost, worker_id, node_address, why);
  });
}

std::vector<std::shared_ptr<TaskRecord>> CoreWorker::DetachConn(Conn* conn) {
  std::vector<std::shared_ptr<TaskRecord>> lost;
  conn->broken = true;
  for (auto& [id, t] : conn->in_flight) lost.push_back(t);
  conn->in_flight.clear();
  if (conn->actor_id.empty()) {
    auto it = queues_.find(conn->key);
    if (it != queues_.end()) {
      auto& ls = it->second->leases;
      ls.erase(std::remove(ls.begin(), ls.end(), conn), ls.end());
    }
  } else {
    auto it = actors_.find(conn->actor_id);
    if (it != actors_.end() && it->second->conn == conn) {
      it->second->conn = nullptr;
      it->second->lost_worker = conn->worker_id;
    }
  }
  // Hand the Conn to housekeeping to be joined (we are running on its reader thread); once
  // shutting down, Shutdown() joins what is in dead_conns_ when it takes conns_.
  for (auto it = conns_.begin(); it != conns_.end(); ++it) {
    if (it->get() == conn) {
      dead_conns_.push_back(std::move(*it));
      if (!shutting_down_) WakeHousekeeping();
      conns_.erase(it);
      break;
    }
  }
  return lost;
}

void CoreWorker::RetryLostTasks(const std::vector<std::shared_ptr<TaskRecord>>& lost,
                                const std::string& worker_id, const std::string& node_address,
                                const std::string& why) {
  std::string desc = "its connection broke (" + why + ")";
  rpc::WorkerExitRequest req;
  req.set_worker_id(worker_id);
  rpc::WorkerExitReply reply;
  auto ctx = NewContext(opts_.token, 3000);
  bool slice_lost = false;
  if (NodeStub(node_address)->GetWorkerExit(ctx.get(), req, &reply).ok() && reply.exited()) {
    desc = reply.description();
    slice_lost = reply.code() == static_cast<int>(StatusCode::kSliceLost);
  }
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& t : lost) {
    if (slice_lost) {
      RetryOrFail(t, desc, nullptr, StatusCode::kSliceLost);
    } else {
      RetryOrFail(t, "worker " + worker_id + " " + desc, nullptr);
    }
  }
  cv_.notify_all();
}

std::shared_ptr<TaskRecord> CoreWorker::NextAttempt(const TaskRecord& t) {
  // A fresh record: the old connection's writer may still be reading the sent spec.
  auto again = std::make_shared<TaskRecord>(t);
  again->spec.set_attempt(again->spec.attempt() + 1);
  again->conn = nullptr;
  SetTaskState(again->spec, rpc::TaskInfo::PENDING);
  return again;
}

void CoreWorker::Resubmit(const TaskRecord& t) { Enqueue(NextAttempt(t)); }

void CoreWorker::RetryOrFail(std::shared_ptr<TaskRecord> t, const std::string& why, Conn*,
                             StatusCode code) {
  if (t->cancelled) {
    FailTask(*t, StatusCode::kCancelled, CancelMessage(*t));
    return;
  }
  if (t->spec.attempt() < t->max_retries) {
    TORUS_LOG(INFO) << "retrying task " << t->spec.function() << " ("
                    << AttemptText(t->spec.attempt() + 2, t->max_retries) << ") because " << why;
    Resubmit(*t);
    return;
  }
  if (code == StatusCode::kSliceLost) {
    FailTask(*t, code, "task " + t->spec.function() + " failed: " + why + " (after " +
                           std::to_string(t->spec.attempt() + 1) + " attempt(s))");
    return;
  }
  FailTask(*t, StatusCode::kWorkerDied,
           "task " + t->spec.function() + " failed: the worker running it died (" + why + ") after " +
               std::to_string(t->spec.attempt() + 1) + " attempt(s)");
}

// ------------------------------------------------------------------------------- idle leases

void CoreWorker::HousekeepingLoop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!shutting_down_) {
    std::vector<Conn*> to_return;
    auto wake_at = CollectIdleLeases(&to_return);
    std::vector<std::shared_ptr<Conn>> to_join = std::move(dead_conns_);
    dead_conns_.clear();
    if (to_return.empty() && to_join.empty()) {
      // Nothing to do before the next lease's linger ends: sleep until then, or until
      // WakeHousekeeping() (a lease went idle, a connection broke) or Shutdown().
      hk_wakes_at_ = wake_at;
      if (wake_at == Clock::time_point::max()) {
        hk_cv_.wait(lock);
      } else {
        hk_cv_.wait_until(lock, wake_at);
      }
      hk_wakes_at_ = Clock::time_point::min();
      continue;
    }
    lock.unlock();
    for (Conn* c : to_return) {
      c->Close();
      ReturnLease(c, false);
    }
    to_join.clear();  // joins reader/writer threads outside the lock
    lock.lock();
  }
}

Clock::time_point CoreWorker::CollectIdleLeases(std::vector<Conn*>* to_return) {
  auto now = Clock::now();
  auto wake_at = Clock::time_point::max();
  for (auto& c : conns_) {
    if (c->broken || c->returned || !c->actor_id.empty() || !c->in_flight.empty()) continue;
    auto qit = queues_.find(c->key);
    bool queue_empty = qit == queues_.end() || qit->second->tasks.empty();
    if (!queue_empty) continue;
    if (now - c->idle_since <= kLeaseLinger) {
      wake_at = std::min(wake_at, c->idle_since + kLeaseLinger + std::chrono::microseconds(100));
      continue;
    }
    c->returned = true;
    if (qit != queues_.end()) {
      auto& ls = qit->second->leases;
      ls.erase(std::remove(ls.begin(), ls.end(), c.get()), ls.end());
    }
    to_return->push_back(c.get());
  }
  return wake_at;
}

void CoreWorker::WakeHousekeeping() {
  // A wake-up time already set comes no later than a lease going idle now would need.
  if (hk_wakes_at_ == Clock::time_point::max()) hk_cv_.notify_one();
}

}  // namespace torus::core
