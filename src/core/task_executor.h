// TaskExecutor: the worker side of the PushTasks stream. Reads the task batches a submitter
// pushes (over gRPC or the worker's lane), runs each task and writes the results back. The
// language-specific part (finding and calling the function) is an Executor (executor.h);
// everything around it is here: the lease the stream names (LeaseUse), the job context of the
// running work, reading the arguments, pinning the refs inside them, storing the result and
// registering the caller as a borrower of the refs inside it, and the actor's state.
//
// THREADS
//  - one thread per inbound stream (a gRPC handler thread or a lane thread) runs ServeTasks.
//    With max_concurrency 1 it runs the tasks itself, one at a time under exec_mu_ (so calls
//    from several callers of one actor never overlap), and writes each batch's results; the
//    stream's writer thread idles. For a threaded actor it hands the tasks to pool_
//    (max_concurrency threads) and the stream's writer thread batches their results.
//  - Execute runs on those threads; it calls the Host (the core worker) without any lock of
//    this class held. Actor state: actor_id_/actor_restarted_ are written by the creation task
//    (before the actor's address is published, so before any call) and read afterwards;
//    actor_exiting_ and max_concurrency_ are atomics.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/lane.h"
#include "common/status.h"
#include "core/executor.h"
#include "core/lease_use.h"
#include "proto/torus.grpc.pb.h"
#include "torus/internal/runtime.h"

namespace torus::core {

// The status message of a task stream refused because its lease was revoked (ServeTasks); the
// submitter's side recognises it.
inline constexpr const char* kLeaseRevokedError = "lease revoked by its node";

inline constexpr const char* kPushTasksMethod = "/torus.rpc.CoreWorker/PushTasks";

// PushTasks served over the lane, with the gRPC stream's Read/Write.
struct LaneTaskServerStream {
  LaneServerStream* s;
  bool Read(rpc::TaskBatch* b) { return s->Read(b); }
  bool Write(const rpc::ResultBatch& b) { return s->Write(b); }
};

class TaskPool;

// The id of the task this thread runs now (set by TaskExecutor while it executes one; empty on
// other threads): what the thread submits meanwhile is that task's child, cancelled with it by a
// recursive cancel. An async actor's coroutines run on its loop thread, which has none.
const std::string& CurrentTaskId();

// Called by the core worker on the thread of a running task that is about to block in Get or
// Wait. On a leased task stream (not an actor's) the worker then hands every task queued behind
// this one back to its submitter (ResultBatch.requeue_from, after the results this stream has
// not yet written), so that no task it waits for waits behind it; it skips what it reads until
// the position the submitter resumes from (TaskBatch.resume_from). Once per blocked task; a
// no-op on any other thread.
void YieldQueuedTasks();

class TaskExecutor {
 public:
  // What the executor needs from the core worker. Called without TaskExecutor's locks.
  class Host {
   public:
    virtual ~Host() = default;
    virtual void WaitReady() = 0;  // until the core worker is connected
    // The job context of the work now running (driver, job, namespace, env vars).
    virtual void EnterTask(const rpc::TaskSpec& spec) = 0;
    // The borrowing protocol for the refs inside the arguments (see CoreWorker).
    virtual std::vector<std::string> PinArgBorrows(const rpc::TaskSpec& spec) = 0;
    virtual void UnpinArgBorrows(const std::vector<std::string>& pinned) = 0;
    virtual void RemoveLocalReference(const std::string& id) = 0;
    virtual StatusOr<std::shared_ptr<internal::Buffer>> Materialize(
        const rpc::ObjectLocation& loc, const std::string& object_id) = 0;
    virtual std::shared_ptr<internal::Buffer> GetOne(const std::string& id) = 0;  // may throw
    // Stores large return value `index` in this node's store (key: its return id and attempt).
    // `size` bytes, filled in place by `write`.
    virtual StatusOr<rpc::ObjectLocation> StoreLarge(const rpc::TaskSpec& spec, int index,
                                                     size_t size,
                                                     const std::function<void(char*)>& write) = 0;
    // Registers `submitter` as a borrower of each id with its owner; lists the registered ids
    // in *registered.
    virtual void RegisterResultBorrows(const std::string& submitter, std::vector<std::string> ids,
                                       google::protobuf::RepeatedPtrField<std::string>* registered) = 0;
    virtual void ReportActorExit(const std::string& actor_id) = 0;  // ray::ExitActor()
    // Ends this process once `grace` has passed (ray::ExitActor(): its result goes out first).
    virtual void ExitSoon(std::chrono::milliseconds grace) = 0;
    virtual void ReturnLease(const std::string& lease_id) = 0;
    // Whether the node this worker belongs to has ended (waiting up to `wait` for a node whose
    // sockets are already closed to be gone). Always false in a driver.
    virtual bool NodeGone(std::chrono::milliseconds wait) = 0;
  };

  TaskExecutor(Host* host, std::unique_ptr<Executor> executor);
  ~TaskExecutor();

  // Serves one inbound PushTasks stream until the submitter closes it.
  template <class Stream>
  grpc::Status ServeTasks(Stream* stream);
  // Runs one task; fills *result.
  void Execute(const rpc::TaskSpec& spec, rpc::TaskResult* result);
  // Asks the executor to interrupt task `task_id` if it is running (Executor::Interrupt).
  // Any thread.
  void Interrupt(const std::string& task_id) { executor_->Interrupt(task_id); }

  LeaseUse& lease_use() { return lease_use_; }
  // A leased stream's state for YieldQueuedTasks (task_executor.cc).
  struct QueueYield;
  // The actor this worker runs ("" if none), and whether it is a restart.
  const std::string& actor_id() const { return actor_id_; }
  bool actor_restarted() const { return actor_restarted_; }

 private:
  // One batch on a sequential worker or actor, run on the stream's thread.
  // Runs the batch's tasks in order into *results. Stops at a call for an actor that does not
  // live in this worker and says so ("" when all ran).
  // `yield` is the stream's state for YieldQueuedTasks (null on an actor's stream).
  std::string RunSequential(rpc::TaskBatch& batch, rpc::ResultBatch* results, QueueYield* yield);
  // Whether failed result `r` failed because this worker's node ended meanwhile (may wait
  // briefly for the node's end to show; see Host::NodeGone).
  bool NodeEndedDuring(const rpc::TaskResult& r);
  // Why `spec`, an actor call, cannot run here (the actor lives elsewhere); "" when it can.
  // Called under exec_mu_ or on the pool (both ordered after the creation that set actor_id_).
  std::string NotHostedHere(const rpc::TaskSpec& spec) const;
  // Fills *views with the arguments' bytes; *keep holds the buffers behind them. Throws.
  void ReadArgs(const rpc::TaskSpec& spec, std::vector<std::shared_ptr<internal::Buffer>>* keep,
                std::vector<internal::ArgView>* views);
  // Runs the executor with the arguments; returns false (result failed) or fills *out.
  bool Invoke(const rpc::TaskSpec& spec, rpc::TaskResult* result, TaskOutput* out);
  void OnExitActor(rpc::TaskResult* result);
  // Puts packed return value `index` into *loc (inline, or in the store when large); false
  // (result failed) when it cannot be stored.
  bool StoreValue(const rpc::TaskSpec& spec, int index, std::string bytes,
                  rpc::ObjectLocation* loc, rpc::TaskResult* result);
  // The same for a value of `size` bytes that `write` fills in place.
  bool StoreWritten(const rpc::TaskSpec& spec, int index, size_t size,
                    const std::function<void(char*)>& write, rpc::ObjectLocation* loc,
                    rpc::TaskResult* result);
  // The returns after the first of a task with several, and the refs packed in each.
  void StoreMoreReturns(const rpc::TaskSpec& spec, TaskOutput& out, rpc::TaskResult* result);

  Host* const host_;
  const std::unique_ptr<Executor> executor_;
  LeaseUse lease_use_;  // the leases the task streams carry (own lock)
  std::unique_ptr<TaskPool> pool_;  // threaded actors
  std::mutex exec_mu_;  // held while a task runs on a sequential worker or actor
  std::atomic<int> max_concurrency_{1};
  std::string actor_id_;
  bool actor_restarted_ = false;
  std::atomic<bool> actor_exiting_{false};  // ExitActor() called: refuse further calls
};

}  // namespace torus::core
