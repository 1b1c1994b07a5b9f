#include "core/task_executor.h"

#include <cxxabi.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <thread>

#include "common/wall_clock.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "core/in_process_task_stream.h"
#include "core/reference_counter.h"
#include "torus/api/exceptions.h"
#include "torus/api/serializer.h"

namespace torus::core {

namespace {
using Clock = std::chrono::steady_clock;

std::string Demangle(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = (status == 0 && d) ? d : name;
  free(d);
  return out;
}

void Fail(rpc::TaskResult* result, StatusCode code, const std::string& msg) {
  result->set_is_error(true);
  SetError(result->mutable_error(), code, msg);
}

// An argument stored on a node whose copy cannot be read (ReadArgs): the task fails with
// ObjectLost naming it, so that its owner can rebuild it and run the task again.
struct ArgLost {
  std::string object_id, message;
};

// The results of one inbound stream, written back in batches by a writer thread (threaded
// actors; a sequential stream writes its results itself). Joined by Finish().
class ResultSink {
 public:
  template <class Stream>
  explicit ResultSink(Stream* stream) {
    writer_ = std::thread([this, stream] { WriteLoop(stream); });
  }
  // A task was handed to the pool; Done() follows with its result.
  void Started() {
    std::lock_guard<std::mutex> lock(mu_);
    outstanding_++;
  }
  void Done(rpc::TaskResult r) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(std::move(r));
    outstanding_--;
    cv_.notify_one();
  }
  // Writes from the stream's own thread (the writer thread has nothing to write then).
  template <class Stream>
  void WriteDirect(Stream* stream, const rpc::ResultBatch& results) {
    if (!write_failed_ && !stream->Write(results)) write_failed_ = true;
  }
  // Reading ended: writes what is outstanding, then joins the writer.
  void Finish() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      reading_done_ = true;
      cv_.notify_one();
    }
    writer_.join();
  }

 private:
  template <class Stream>
  void WriteLoop(Stream* stream) {
    while (true) {
      rpc::ResultBatch batch;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !q_.empty() || (reading_done_ && outstanding_ == 0); });
        if (q_.empty()) return;
        while (!q_.empty()) {
          *batch.add_results() = std::move(q_.front());
          q_.pop_front();
        }
      }
      WriteDirect(stream, batch);
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<rpc::TaskResult> q_;
  int outstanding_ = 0;
  bool reading_done_ = false;
  std::atomic<bool> write_failed_{false};
  std::thread writer_;
};

// Restores the previous result-ref collector and drops the refs it held when it goes.
struct ResultRefs {
  TaskExecutor::Host* host;
  internal::RefCollector c;
  internal::RefCollector* prev;
  explicit ResultRefs(TaskExecutor::Host* h) : host(h), prev(internal::ResultRefCollector()) {
    c.hold = true;
    internal::ResultRefCollector() = &c;
  }
  ~ResultRefs() {
    internal::ResultRefCollector() = prev;
    for (const auto& id : c.ids) host->RemoveLocalReference(id);
  }
};

// Unpins the refs inside a task's arguments when it goes.
struct ArgBorrows {
  TaskExecutor::Host* host;
  std::vector<std::string> pinned;
  ~ArgBorrows() {
    if (!pinned.empty()) host->UnpinArgBorrows(pinned);
  }
};

}  // namespace

// Runs tasks of a threaded actor on up to max_concurrency threads, started as calls arrive
// (an async Python actor allows 1000 but rarely needs them). Joined when it goes.
class TaskPool {
 public:
  using Done = std::function<void(rpc::TaskResult)>;
  explicit TaskPool(TaskExecutor* ex) : ex_(ex) {}
  ~TaskPool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
      cv_.notify_all();
    }
    for (auto& t : threads_) t.join();
  }
  void Resize(int n) {
    std::lock_guard<std::mutex> lock(mu_);
    max_threads_ = n;
  }
  void Submit(rpc::TaskSpec spec, Done done) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.emplace_back(std::move(spec), std::move(done));
    if (idle_ < q_.size() && static_cast<int>(threads_.size()) < max_threads_) {
      threads_.emplace_back([this] { Loop(); });
    } else {
      cv_.notify_one();
    }
  }

 private:
  void Loop() {
    while (true) {
      std::pair<rpc::TaskSpec, Done> item;
      {
        std::unique_lock<std::mutex> lock(mu_);
        idle_++;
        cv_.wait(lock, [&] { return stop_ || !q_.empty(); });
        idle_--;
        if (q_.empty()) return;
        item = std::move(q_.front());
        q_.pop_front();
      }
      rpc::TaskResult r;
      ex_->Execute(item.first, &r);
      item.second(std::move(r));
    }
  }
  TaskExecutor* ex_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<rpc::TaskSpec, Done>> q_;
  std::vector<std::thread> threads_;
  int max_threads_ = 0;
  size_t idle_ = 0;  // threads waiting for a call
  bool stop_ = false;
};

// A leased stream's state for YieldQueuedTasks, used on the stream's thread only.
struct TaskExecutor::QueueYield {
  std::function<void(rpc::ResultBatch&)> write;  // writes on the stream
  rpc::ResultBatch* pending = nullptr;  // results of this batch not yet written
  uint64_t position = 0;                // of the task read last (1-based)
  bool yielded = false;                 // until the position the submitter resumes from
  uint64_t resume_at = 0;               // that position (TaskBatch.resume_from); 0: not yet known
};

namespace {
thread_local TaskExecutor::QueueYield* t_yield = nullptr;

struct YieldScope {
  explicit YieldScope(TaskExecutor::QueueYield* y) { t_yield = y; }
  ~YieldScope() { t_yield = nullptr; }
};
}  // namespace

void YieldQueuedTasks() {
  TaskExecutor::QueueYield* y = t_yield;
  if (!y || y->yielded) return;
  y->yielded = true;
  // The results this batch already has go first: a task waited for may be one of them.
  rpc::ResultBatch notice;
  notice.mutable_results()->Swap(y->pending->mutable_results());
  notice.set_requeue_from(y->position + 1);
  y->write(notice);
}

TaskExecutor::TaskExecutor(Host* host, std::unique_ptr<Executor> executor)
    : host_(host), executor_(std::move(executor)), pool_(std::make_unique<TaskPool>(this)) {}

TaskExecutor::~TaskExecutor() = default;

template <class Stream>
grpc::Status TaskExecutor::ServeTasks(Stream* stream) {
  // The node may push work as soon as we registered, before Connect() has finished.
  host_->WaitReady();
  ResultSink sink(stream);
  rpc::TaskBatch batch;
  std::string lease_id;
  bool refused = false;
  std::string refusal;  // a call for an actor that does not live here
  lease_use_.StreamOpened();
  rpc::ResultBatch results;
  QueueYield yield;
  yield.write = [&](rpc::ResultBatch& b) { sink.WriteDirect(stream, b); };
  yield.pending = &results;
  while (stream->Read(&batch)) {
    if (lease_id.empty() && !batch.lease_id().empty()) {
      if (!lease_use_.Named(batch.lease_id())) {
        // The node took this lease back (its holder did not come within the grant's deadline)
        // and may have leased us to someone else: run nothing for this stream.
        refused = true;
        TORUS_LOG(WARNING) << "refusing tasks for lease " << batch.lease_id()
                           << ": the node revoked it before its holder connected";
        break;
      }
      lease_id = batch.lease_id();
    }
    if (max_concurrency_ <= 1) {
      // Only this thread writes while the stream is sequential (the sink's writer thread
      // serves the pool path), so writing here directly is safe and saves a thread hand-off.
      if (batch.resume_from() && yield.yielded) yield.resume_at = batch.resume_from();
      refusal = RunSequential(batch, &results, lease_id.empty() ? nullptr : &yield);
      if (results.results_size()) sink.WriteDirect(stream, results);
      results.Clear();
      // A caller with a stale address for an actor (its worker died and this process took its
      // port): end the stream without running or answering the call, so the caller treats it
      // as the lost connection it is and asks the head where the actor lives.
      if (!refusal.empty()) break;
    } else {
      for (auto& spec : *batch.mutable_tasks()) {
        sink.Started();
        pool_->Submit(std::move(spec), [&sink](rpc::TaskResult r) { sink.Done(std::move(r)); });
      }
    }
    batch.Clear();
  }
  sink.Finish();
  lease_use_.StreamClosed(lease_id);
  if (refused) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        std::string(kLeaseRevokedError) + ": " + batch.lease_id());
  }
  if (!refusal.empty()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, refusal);
  // The lease holder is gone or done with us; returning twice is harmless (ids are unique).
  if (!lease_id.empty()) host_->ReturnLease(lease_id);
  return grpc::Status::OK;
}

bool TaskExecutor::NodeEndedDuring(const rpc::TaskResult& r) {
  switch (static_cast<StatusCode>(r.error().code())) {
    case StatusCode::kObjectLost:   // an argument could not be read (into our node's store)
    case StatusCode::kUnavailable:  // the result could not be stored in our node's store
      return host_->NodeGone(std::chrono::milliseconds(200));
    default:  // anything else the user code met: only when the node is known gone already
      return host_->NodeGone(std::chrono::milliseconds(0));
  }
}

std::string TaskExecutor::NotHostedHere(const rpc::TaskSpec& spec) const {
  if (spec.actor_creation() || spec.actor_id().empty() || spec.actor_id() == actor_id_) return {};
  // A caller with a stale address: the actor's worker died and this process took its port.
  return "actor " + spec.actor_id() + " does not live in this worker (" +
         (actor_id_.empty() ? std::string("it hosts no actor") : "it hosts actor " + actor_id_) +
         ")";
}

std::string TaskExecutor::RunSequential(rpc::TaskBatch& batch, rpc::ResultBatch* results,
                                        QueueYield* yield) {
  // One task at a time (exec_mu_ serialises callers of an actor); the whole batch is answered
  // with one write.
  for (auto& spec : *batch.mutable_tasks()) {
    if (yield) {
      yield->position++;
      if (yield->yielded) {
        // Handed back to the submitter, which runs it elsewhere; a handed-back task's copy may
        // still arrive after the resume (it was queued for this stream before the hand-back).
        if (yield->resume_at == 0 || yield->position < yield->resume_at) continue;
        yield->yielded = false;
        yield->resume_at = 0;
      }
    }
    std::lock_guard<std::mutex> exec_lock(exec_mu_);
    if (std::string why = NotHostedHere(spec); !why.empty()) return why;  // see ServeTasks
    rpc::TaskResult r;
    {
      const bool plain_task = spec.actor_id().empty() && !spec.actor_creation();
      YieldScope scope(yield && plain_task ? yield : nullptr);
      Execute(spec, &r);
    }
    if (r.is_error() && yield && NodeEndedDuring(r)) {
      // What failed here is this worker's node, not the task: answer nothing (this process
      // ends with its node), so that the submitter sees the worker die and retries the tasks.
      results->Clear();
      return "the node of this worker ended while task " + spec.function() + " ran";
    }
    const bool created = spec.actor_creation() && !r.is_error();
    *results->add_results() = std::move(r);
    if (created && spec.max_concurrency() > 1) {
      pool_->Resize(spec.max_concurrency());
      max_concurrency_ = spec.max_concurrency();
    }
  }
  return {};
}

namespace {
thread_local const std::string* t_task_id = nullptr;

struct CurrentTaskScope {
  explicit CurrentTaskScope(const std::string* id) : prev(t_task_id) { t_task_id = id; }
  ~CurrentTaskScope() { t_task_id = prev; }
  const std::string* prev;
};
}  // namespace

const std::string& CurrentTaskId() {
  static const std::string kNone;
  return t_task_id ? *t_task_id : kNone;
}

void TaskExecutor::Execute(const rpc::TaskSpec& spec, rpc::TaskResult* result) {
  auto start = Clock::now();
  result->set_start_us(WallClockUs());
  CurrentTaskScope current(&spec.task_id());
  if (!spec.driver_address().empty()) host_->EnterTask(spec);
  result->set_task_id(spec.task_id());
  result->set_return_id(spec.return_id());
  result->set_seq(spec.seq());
  if (actor_exiting_) {
    Fail(result, StatusCode::kActorDied, "actor " + actor_id_ + " has exited (ray::ExitActor())");
    return;
  }
  if (std::string why = NotHostedHere(spec); !why.empty()) {
    // A threaded actor's pool (RunSequential ends the stream instead).
    Fail(result, StatusCode::kActorDied, why + ": the caller's address for it is stale");
    return;
  }
  // Refs packed into the result are collected (and held) while the invoker packs it.
  ResultRefs result_refs(host_);
  // Refs inside the arguments: registered with their owners now, in one call per owner, and
  // pinned while the task runs (unpacking them then costs no call).
  ArgBorrows arg_borrows{host_, host_->PinArgBorrows(spec)};
  TaskOutput out;
  const bool invoked = Invoke(spec, result, &out);
  result->set_exec_us(
      std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count());
  if (!invoked) return;
  const bool stored =
      out.write_value
          ? StoreWritten(spec, 0, out.value_size, out.write_value, result->mutable_value(), result)
          : StoreValue(spec, 0, std::move(out.value), result->mutable_value(), result);
  if (!stored) return;
  if (spec.num_returns() > 1) {
    StoreMoreReturns(spec, out, result);
    return;
  }
  // The result refers to objects: the submitter becomes a borrower of each before we reply
  // (our own hold on them ends when result_refs goes).
  if (!result_refs.c.ids.empty()) {
    host_->RegisterResultBorrows(spec.owner_address(), result_refs.c.ids,
                                 result->mutable_nested_ids());
  }
}

void TaskExecutor::StoreMoreReturns(const rpc::TaskSpec& spec, TaskOutput& out,
                                    rpc::TaskResult* result) {
  const int n = spec.num_returns();
  if (static_cast<int>(out.more.size()) != n - 1 ||
      (!out.nested.empty() && static_cast<int>(out.nested.size()) != n)) {
    Fail(result, StatusCode::kInternal,
         "the executor of " + spec.function() + " gave " + std::to_string(out.more.size() + 1) +
             " return values for num_returns=" + std::to_string(n));
    return;
  }
  for (int i = 1; i < n; ++i) {
    rpc::ReturnValue* rv = result->add_more_returns();
    if (!StoreValue(spec, i, std::move(out.more[i - 1]), rv->mutable_value(), result)) {
      result->clear_more_returns();
      return;
    }
  }
  // Each return's packed refs, registered per return: a ref packed into two returns is two
  // registrations, one for each value that holds it.
  for (int i = 0; i < static_cast<int>(out.nested.size()); ++i) {
    if (out.nested[i].empty()) continue;
    host_->RegisterResultBorrows(spec.owner_address(), std::move(out.nested[i]),
                                 i == 0 ? result->mutable_nested_ids()
                                        : result->mutable_more_returns(i - 1)->mutable_nested_ids());
  }
}

void TaskExecutor::ReadArgs(const rpc::TaskSpec& spec,
                            std::vector<std::shared_ptr<internal::Buffer>>* keep,
                            std::vector<internal::ArgView>* views) {
  views->reserve(spec.args_size());
  keep->reserve(spec.args_size());
  for (const auto& a : spec.args()) {
    if (!a.is_ref()) {
      views->push_back({a.value().data(), a.value().size()});
      keep->push_back(nullptr);
    } else if (a.location_known() && !a.location().in_shm()) {
      views->push_back({a.location().inline_data().data(), a.location().inline_data().size()});
      keep->push_back(nullptr);
    } else if (a.location_known()) {
      auto b = host_->Materialize(a.location(), a.ref_id());
      if (!b.ok()) throw ArgLost{a.ref_id(), b.status().message()};
      keep->push_back(*b);
      views->push_back({(*b)->data(), (*b)->size()});
    } else {
      auto b = host_->GetOne(a.ref_id());
      keep->push_back(b);
      views->push_back({b->data(), b->size()});
    }
  }
}

bool TaskExecutor::Invoke(const rpc::TaskSpec& spec, rpc::TaskResult* result, TaskOutput* output) {
  const std::string what = spec.actor_creation() ? "constructor " : "task ";
  try {
    std::vector<std::shared_ptr<internal::Buffer>> keep;
    std::vector<internal::ArgView> views;
    ReadArgs(spec, &keep, &views);
    if (spec.actor_creation()) {
      // Set before the factory runs: its constructor may ask WasCurrentActorRestarted().
      actor_id_ = spec.actor_id();
      actor_restarted_ = spec.restarted();
    }
    auto out = executor_->Invoke(spec, views, keep);
    if (!out.ok()) {
      Fail(result, out.status().code(), out.status().message());
      return false;
    }
    *output = std::move(*out);
    return true;
  } catch (const ExitActorSignal&) {
    OnExitActor(result);
  } catch (const ArgLost& lost) {
    Fail(result, StatusCode::kObjectLost,
         what + spec.function() + " could not read its argument " + lost.object_id + ": " + lost.message);
    result->set_lost_object_id(lost.object_id);
  } catch (const internal::RayException& e) {
    // A system error surfaced inside user code (e.g. a failed nested Get): pass it on.
    Fail(result, StatusCode::kTaskError, what + spec.function() + " failed: " +
                                             Demangle(typeid(e).name()) + ": " + e.what());
  } catch (const std::exception& e) {
    Fail(result, StatusCode::kTaskError, what + spec.function() + " threw " +
                                             Demangle(typeid(e).name()) + ": " + e.what());
  } catch (...) {
    Fail(result, StatusCode::kTaskError, "task " + spec.function() + " threw a non-std::exception value");
  }
  return false;
}

void TaskExecutor::OnExitActor(rpc::TaskResult* result) {
  actor_exiting_ = true;
  host_->ReportActorExit(actor_id_);
  Fail(result, StatusCode::kActorDied, "actor " + actor_id_ + " exited: it called ray::ExitActor()");
  // The worker's main thread ends the process once this result had time to go out.
  host_->ExitSoon(std::chrono::milliseconds(200));
}

bool TaskExecutor::StoreValue(const rpc::TaskSpec& spec, int index, std::string bytes,
                              rpc::ObjectLocation* loc, rpc::TaskResult* result) {
  if (bytes.size() < kInlineLimit) {
    loc->set_inline_data(std::move(bytes));
    return true;
  }
  return StoreWritten(
      spec, index, bytes.size(),
      [&bytes](char* dst) { internal::CopyLarge(dst, bytes.data(), bytes.size()); }, loc, result);
}

bool TaskExecutor::StoreWritten(const rpc::TaskSpec& spec, int index, size_t size,
                                const std::function<void(char*)>& write, rpc::ObjectLocation* loc,
                                rpc::TaskResult* result) {
  if (size < kInlineLimit) {
    std::string bytes(size, '\0');
    write(bytes.data());
    loc->set_inline_data(std::move(bytes));
    return true;
  }
  auto stored = host_->StoreLarge(spec, index, size, write);
  if (!stored.ok()) {
    // Unreachable node: kUnavailable (see NodeEndedDuring); anything else the store said.
    const StatusCode code = stored.status().code() == StatusCode::kUnavailable
                                ? StatusCode::kUnavailable
                                : StatusCode::kInternal;
    Fail(result, code,
         "cannot store the result of " + spec.function() + ": " + stored.status().message());
    return false;
  }
  *loc = *stored;
  return true;
}

template grpc::Status TaskExecutor::ServeTasks(
    grpc::ServerReaderWriter<rpc::ResultBatch, rpc::TaskBatch>* stream);
template grpc::Status TaskExecutor::ServeTasks(LaneTaskServerStream* stream);
template grpc::Status TaskExecutor::ServeTasks(InProcessTaskStream* stream);

}  // namespace torus::core
