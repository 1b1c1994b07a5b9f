// The core library inside every driver and worker process: owns the objects this process
// creates, submits tasks (leasing workers from nodes, pushing task batches over one stream per
// leased worker) and actor calls (one stream per actor), and, in workers, executes what is
// pushed to it. Implements torus::internal::Runtime for the header-only API.
//
// The parts with their own class: ReferenceCounter (refs_: object entries and counts), Conn
// (one outgoing PushTasks stream), HeadClient (head_: jobs, actors, placement groups, slices,
// names, KV), TaskExecutor (workers: runs pushed tasks through a language Executor),
// LogForwarder (workers: output to the driver), WorkQueue (fire-and-forget RPCs). CoreWorker's
// own methods are split by concept over core_worker.cc (lifecycle, worker side),
// core_worker_objects.cc, core_worker_borrows.cc, core_worker_tasks.cc, core_worker_actors.cc,
// core_worker_lineage.cc (lost objects rebuilt) and infeasible_warning.cc; they share mu_.
//
// THREADS
//  - user threads call the Runtime methods; state is guarded by mu_ (objects via refs_, submit
//    queues, actor queues, connections); cv_ signals object readiness.
//  - one writer and one reader thread per outgoing stream (Conn): the writer drains the
//    connection's send queue into one TaskBatch per Write (natural batching under load); the
//    reader stores results and fails/retries in-flight work when the stream breaks.
//  - tracked helper threads (SpawnTracked, joined by Shutdown): one per outstanding lease
//    request (RequestLease blocks at the node), per actor being resolved, per borrowed object
//    being fetched, per broken connection (asks node/head why, then retries or fails), per
//    task whose argument was lost (waits for its node's death, rebuilds, runs the task again).
//  - housekeeping thread: sleeps on hk_cv_ (with mu_) until the next idle lease's linger ends
//    or WakeHousekeeping(); returns idle leases and joins broken connections' threads.
//  - borrow thread: sends queued borrow releases, probes borrowers once a second.
//  - rpc_work_: up to 4 threads for FreeObjects/ReturnLease/CancelTask calls; drained at Shutdown().
//  - head_ (HeadClient): calls from any thread without mu_; in drivers it owns the WatchJob
//    thread (head_client.h).
//  - workers only: the threads of TaskExecutor (task_executor.h) and LogForwarder
//    (log_forwarder.h); the main thread sits in RunWorkerLoop, asleep until an exit request,
//    SIGTERM, ExitActor's deadline or its node's end.
#pragma once

#include <array>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/lane.h"
#include "common/resources.h"
#include "common/shm.h"
#include "common/status.h"
#include "core/lease_use.h"
#include "core/conn.h"
#include "core/cpp_executor.h"
#include "core/head_client.h"
#include "core/node_liveness.h"
#include "core/reference_counter.h"
#include "core/task_executor.h"
#include "proto/torus.grpc.pb.h"
#include "torus/internal/runtime.h"

namespace torus {
class WorkQueue;
}  // namespace torus

namespace torus::core {

class CoreWorker;

struct CoreWorkerOptions {
  bool is_driver = true;
  std::string worker_id;          // "" = random
  std::string node_address;       // the local node
  std::string head_address;
  std::string token;
  std::string job_id;
  std::string ray_namespace;
  std::vector<std::string> code_search_path;  // drivers: passed to workers
  std::string bind_host = "127.0.0.1";
  // Drivers: the job's settings (RayConfig), carried in every TaskSpec so that work submitted
  // from workers gets them too.
  bool default_detached = false;                         // default_actor_lifetime
  std::map<std::string, std::string> job_env_vars;        // runtime_env env_vars
  // The command line of a Python worker (interpreter, bootstrap, import path) for the Python
  // tasks and actors this process submits; empty: TORUS_PYTHON_WORKER_COMMAND (a JSON list)
  // or `python3 -m torus._private.worker_main`.
  std::vector<std::string> python_worker_command;
  // Drivers with a python_worker_command: how many idle workers of this job their node keeps
  // ready (RegisterWorkerRequest.warm_workers); 0: none.
  int warm_workers = 0;
  // Workers: the language executor to run tasks with; null: the C++ one (RAY_REMOTE).
  std::function<std::unique_ptr<Executor>()> make_executor;
  // Called once connected, before any pushed work runs (workers publish the runtime here, so the
  // first task can already use the API).
  std::function<void(CoreWorker*)> on_ready;
};

// The Python worker command: `given` (a Python driver's), else TORUS_PYTHON_WORKER_COMMAND (a
// JSON list: in a Python worker, set by its node to the command that started it; a C++ driver
// may set it too), else `python3 -m torus._private.worker_main`.
std::vector<std::string> PythonWorkerCommand(const std::vector<std::string>& given);

class LogForwarder;

class CoreWorker final : public internal::Runtime,
                         public rpc::CoreWorker::Service,
                         private Conn::Listener,
                         private TaskExecutor::Host {
 public:
  static StatusOr<std::unique_ptr<CoreWorker>> Create(CoreWorkerOptions opts);
  ~CoreWorker() override;

  // Workers: serve pushed tasks until told to exit or the node goes away. Never returns.
  [[noreturn]] void RunWorkerLoop();
  // Drivers: finish the job (kills its non-detached actors), stop threads, free owned objects.
  void Shutdown();

  const std::string& worker_id() const { return opts_.worker_id; }
  const std::string& address() const { return address_; }
  const std::string& node_id() const { return node_id_; }

  // internal::Runtime
  std::string Put(std::string msgpack_bytes) override;
  std::string PutWith(size_t size, const std::function<void(char* dst)>& fill,
                      bool may_hold_refs = true) override;
  // Values lost with their node are rebuilt first (RecoverLost).
  std::vector<std::shared_ptr<internal::Buffer>> Get(const std::vector<std::string>& ids,
                                                     int timeout_ms) override;
  // An owned value already here inline is answered under mu_ alone; anything else goes through Get.
  std::shared_ptr<internal::Buffer> GetOne(const std::string& id, int timeout_ms) override;
  std::vector<bool> Wait(const std::vector<std::string>& ids, int num_objects,
                         int timeout_ms) override;
  std::string SubmitTask(const std::string& function_name, std::vector<internal::TaskArg> args,
                         const internal::TaskOptions& options) override;
  std::string CreateActor(const std::string& factory_name, std::vector<internal::TaskArg> args,
                          const internal::ActorOptions& options) override;
  std::string SubmitActorTask(const std::string& actor_id, const std::string& method_name,
                              std::vector<internal::TaskArg> args,
                              const internal::TaskOptions& options) override;
  void AddLocalReference(const std::string& id) override;
  void RemoveLocalReference(const std::string& id) override;
  std::string GetNamedActor(const std::string& name, const std::string& ray_namespace) override;
  void KillActor(const std::string& actor_id, bool no_restart) override;
  void ExitActor() override;
  bool WasCurrentActorRestarted() override;
  // Drivers: their own; workers: those of the work they are running.
  std::string GetNamespace() override;
  // The job's default actor lifetime here (drivers: their own; workers: that of the work they
  // are running): true when actors created without a lifetime are detached.
  bool DefaultDetached();
  std::string JobId();
  // Cancels the task whose result is `object_id` (Ray's cancel): a task not yet running never
  // runs; a running one is interrupted and its value dropped, or with `force` its worker is
  // killed (an actor call throws RayInvalidArgumentException, as in Ray). With `recursive`,
  // what the task submitted is cancelled too, the same way, before its worker is killed. Get
  // then throws TaskCancelledException. False when the object is unknown here.
  bool Cancel(const std::string& object_id, bool force, bool recursive) override;
  // Cancels (recursively, with `force` too) every task that `parent_task`, running here,
  // submitted and that has not ended. No lock held on entry.
  void CancelChildren(const std::string& parent_task, bool force = false);
  // Workers: the actor this process hosts ("" if none).
  std::string CurrentActorId() const {
    return task_executor_ ? task_executor_->actor_id() : std::string();
  }
  // The head called now (of the head and its standbys).
  std::string head_address() const { return head_ ? head_->address() : opts_.head_address; }
  const std::string& node_address() const { return opts_.node_address; }
  const std::string& token() const { return opts_.token; }
  const std::string& session_dir() const { return session_dir_; }
  bool is_driver() const { return opts_.is_driver; }
  bool shutting_down() const { return shutting_down_; }
  // The head's client: the key-value store, the cluster listing, and what the Runtime methods
  // below forward to it.
  HeadClient& head() { return *head_; }

  std::string CreatePlacementGroup(const internal::PlacementGroupSpec& spec) override;
  void RemovePlacementGroup(const std::string& id) override;
  bool WaitPlacementGroup(const std::string& id, int timeout_seconds) override;
  internal::PlacementGroupInfo GetPlacementGroupInfo(const std::string& id,
                                                     const std::string& name) override;
  std::vector<internal::PlacementGroupInfo> GetAllPlacementGroups() override;
  internal::SliceQueryResult QuerySlices(const std::string& topology, const std::string& version,
                                         int chips_per_vm, const std::string& slice_name) override;

  // rpc::CoreWorker::Service
  grpc::Status PushTasks(grpc::ServerContext*,
                         grpc::ServerReaderWriter<rpc::ResultBatch, rpc::TaskBatch>*) override;
  grpc::Status GetObject(grpc::ServerContext*, const rpc::GetObjectRequest*,
                         rpc::GetObjectReply*) override;
  grpc::Status BorrowObjects(grpc::ServerContext*, const rpc::BorrowObjectsRequest*,
                             rpc::BorrowObjectsReply*) override;
  grpc::Status Exit(grpc::ServerContext*, const rpc::Empty*, rpc::Empty*) override;
  grpc::Status PrintLogs(grpc::ServerContext*, const rpc::LogBatch*, rpc::Empty*) override;
  grpc::Status ListTasks(grpc::ServerContext*, const rpc::Empty*, rpc::TaskList*) override;
  grpc::Status TaskCounts(grpc::ServerContext*, const rpc::Empty*, rpc::TaskCountsReply*) override;
  grpc::Status CheckLease(grpc::ServerContext*, const rpc::CheckLeaseRequest*,
                          rpc::CheckLeaseReply*) override;
  grpc::Status CancelTask(grpc::ServerContext*, const rpc::CancelTaskRequest*,
                          rpc::Empty*) override;

  // Workers: sends what user code writes to stdout/stderr (fds 1 and 2) to the driver of the
  // work being run, besides the worker's log files. Call once, early.
  void CaptureOutput();

  // Conn::Listener (called on a Conn's reader thread, without mu_).
  bool OnResults(Conn* conn, rpc::ResultBatch& batch) override;
  void OnConnBroken(Conn* conn, const std::string& why) override;


 private:
  explicit CoreWorker(CoreWorkerOptions opts);
  Status Connect();
  // The runtime keys of C++ and Python work, and in workers the task executor. Part of Connect.
  void SetUpExecution();

  // A new owned object id; n > 1 reserves n consecutive ids (a task's returns: ReturnIdOf).
  std::string NewObjectId(int n = 1);
  std::string PutBytes(std::string bytes, std::vector<std::string> nested);
  // Object store. Require mu_.
  void StoreResult(const std::string& id, rpc::TaskResult& r);  // takes the value out of r
  // A task's result into each of its returns (one, or spec.num_returns). Takes values out of r.
  void StoreTaskResult(const rpc::TaskSpec& spec, rpc::TaskResult& r);
  // Frees store segments in the background (fire and forget). Any lock.
  void FreeInStore(ReferenceCounter::FreeRequest r);
  // Borrowed references (docs/objects.md); the counting is refs_'s.
  // One BorrowObjects call to `owner`; adds the ids it does not own to *unknown. No lock.
  grpc::Status CallBorrow(const std::string& owner, const std::string& borrower, int delta,
                          const std::vector<std::string>& ids, std::set<std::string>* unknown,
                          int deadline_ms, bool cancellable = true);
  // TaskExecutor::Host (called on the threads running tasks, without mu_).
  void WaitReady() override;
  void EnterTask(const rpc::TaskSpec& spec) override;
  std::shared_ptr<internal::Buffer> GetOne(const std::string& id) override;
  StatusOr<rpc::ObjectLocation> StoreLarge(const rpc::TaskSpec& spec, int index, size_t size,
                                           const std::function<void(char*)>& write) override;
  void ReportActorExit(const std::string& actor_id) override;
  void ExitSoon(std::chrono::milliseconds grace) override;
  void ReturnLease(const std::string& lease_id) override;
  bool NodeGone(std::chrono::milliseconds wait) override;
  // Executor side: registers `submitter` as a borrower of each id (with their owners) and lists
  // the registered ones in *registered. No lock.
  void RegisterResultBorrows(const std::string& submitter, std::vector<std::string> ids,
                             google::protobuf::RepeatedPtrField<std::string>* registered) override;
  // No lock. Sends queued releases; probes borrowers and drops those that are gone.
  void BorrowLoop();
  void FlushBorrowReleases(int deadline_ms, bool cancellable);
  void ProbeBorrowers();
  // No lock. Gives back every registration this process holds (clean exit).
  void ReleaseAllBorrows(int deadline_ms);
  // Executor side: registers with the owners of the refs inside the task's arguments (one call
  // per owner) and pins them for the task's duration; UnpinArgBorrows ends that. No lock.
  std::vector<std::string> PinArgBorrows(const rpc::TaskSpec& spec) override;
  void UnpinArgBorrows(const std::vector<std::string>& pinned) override;
  void FailObject(const std::string& id, StatusCode code, const std::string& msg);
  // The ids of `ids` that are not ready and why (at most 3), for a timeout's message. Requires mu_.
  std::string DescribeNotReady(const std::vector<std::string>& ids);
  // Location of a value we hold, for an Arg or a GetObject reply. Require mu_.
  bool LocationOf(const std::string& id, rpc::ObjectLocation* loc, bool* is_error,
                  rpc::Error* err);
  // Fetch a borrowed object from its owner in the background (no lock held by caller? holds mu_).
  void EnsureFetching(const std::string& id);
  // `lost`: the location the owner gave could not be read (GetObjectRequest.lost).
  void FetchFromOwner(const std::string& id, bool lost = false, const std::string& lost_key = "");
  // Turns a stored location into readable bytes (maps shm, pulls from other nodes). No lock.
  // Reserves `size` bytes under `key` in this node's store, pinned once for the writer (who
  // unpins it with UnpinLocal once written, or hands the pin to an ArenaBuffer). No lock.
  StatusOr<rpc::ObjectLocation> CreateInStore(const std::string& object_id, const std::string& key,
                                              uint64_t size, const std::string& owner);
  StatusOr<std::shared_ptr<internal::Buffer>> Materialize(const rpc::ObjectLocation& loc,
                                                          const std::string& object_id) override;
  // Spilling (docs/object_store.md): one pin on a value in this node's arena when `loc` still
  // names it there (false: spilled, moved or freed). Lock-free.
  bool PinLocal(const rpc::ObjectLocation& loc);
  void UnpinLocal(uint64_t offset);
  // Runs `write` on a range CreateInStore reserved, then gives the writer's pin back; when it
  // throws, also frees the range, and rethrows. No lock.
  void WriteInStore(const rpc::ObjectLocation& loc, const std::function<void(char*)>& write);
  // [offset, offset + size) lies in the arena after a header.
  bool InArena(uint64_t offset, uint64_t size) const;
  // The pinned offset a CreateObject/RestoreObject reply carries for `size` bytes, or its error.
  StatusOr<uint64_t> PinnedOffset(const rpc::CreateObjectReply& reply, uint64_t size) const;
  // The value at `loc` in this node's store, pinned: in place, or restored by the node first
  // (which also updates the entry's offset under mu_). No lock held on entry.
  StatusOr<std::shared_ptr<internal::Buffer>> ReadLocal(const rpc::ObjectLocation& loc,
                                                        const std::string& object_id);
  void ThrowIfError(const std::string& id, const ObjectEntry& e);

  // Lost objects (core_worker_lineage.cc, docs/objects.md "Lost objects").
  // Keeps the finished normal task `t` as the lineage of its returns, when it has retries left.
  // Call before its pins are released. Requires mu_.
  void KeepLineage(const std::shared_ptr<TaskRecord>& t);
  // Runs the task that made `id` (owned) again, first rebuilding those of its owned arguments
  // that are evicted or stored on a node `nodes` says is gone. "" when it was started (or already runs),
  // else why it cannot be. Requires mu_.
  std::string Rebuild(const std::string& id, const NodeLiveness& nodes,
                      const std::string& cause);
  // What the head's node list says (node_liveness.h). No lock.
  NodeLiveness LiveNodes();
  // Rebuild() of our `id`, lost because of `cause`; when it cannot be rebuilt, fails it with
  // ObjectLost saying why. Requires mu_.
  void RebuildOrFail(const std::string& id, const NodeLiveness& nodes,
                     const std::string& cause);
  // Waiting for the head to declare a node dead: calls `step` under mu_ with what the head
  // says of the nodes (LiveNodes) every 250 ms until it returns true
  // (returns true), shutdown (true), or kNodeDeathWaitMs pass (false). No lock.
  bool PollNodeDeath(const std::function<bool(const NodeLiveness& nodes)>& step);
  // A value Get could not read from the node at `loc`.
  struct LostRead {
    std::string id;
    rpc::ObjectLocation loc;
    std::string message;
  };
  // Get's reaction to values it could not read: rebuilds what is ours and lost, asks the owner to
  // for what is borrowed. True: read again now; false: a node that could not be read is still
  // listed alive (wait, then read again). Throws when a value cannot be had. No lock.
  bool RecoverLost(const std::vector<LostRead>& lost);
  // GetObject with `lost`: a borrower could not read our object `id`; rebuild it if its node is
  // gone. No lock.
  void RebuildForBorrower(const std::string& id, const std::string& lost_key);
  // How long a reader waits for the head to declare dead a node whose copy it cannot read.
  static constexpr int kNodeDeathWaitMs = 60000;
  // Guarded by mu_: when a Get first failed to read each value whose node is listed alive
  // (RecoverLost); an entry goes once its node is declared dead or the wait is over.
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> unreadable_since_;
  // Drops an entry's value (it is being made again, or its copy is gone); the refs held by the
  // value stay held (a value made again gives its own registrations back). Requires mu_.
  static void ResetValue(ObjectEntry& e);
  // The task of `t` once more, as a new attempt, after its argument `lost_id` (ours) could not be
  // read by its executor: rebuilds that argument first when its node is gone. No lock (a
  // tracked thread; waits for the head to declare the node dead, at most kNodeDeathWaitMs).
  void RetryAfterLostArg(std::shared_ptr<TaskRecord> t, std::string lost_id, rpc::Error error);
  // Sends `again` (a new attempt) once its arguments are ready, looking their locations up anew;
  // `pin`: pin its refs (a rebuild), else it keeps the pins it came with. Requires mu_.
  void Requeue(std::shared_ptr<TaskRecord> again, bool pin);
  // One round of Get: waits, reads, and lists in *lost the values it could not read.
  std::vector<std::shared_ptr<internal::Buffer>> GetRound(const std::vector<std::string>& ids,
                                                          std::chrono::steady_clock::time_point deadline,
                                                          int timeout_ms, std::vector<LostRead>* lost);
  // The steps of Get. Require mu_ (held in `lock`).
  struct ReadyScan;
  void StartFetches(const std::vector<std::string>& ids);  // throws for a freed object of ours
  void WaitAllReady(std::unique_lock<std::mutex>& lock, ReadyScan& scan,
                    std::chrono::steady_clock::time_point deadline, int timeout_ms);
  void ReadValues(ReadyScan& scan, std::vector<std::shared_ptr<internal::Buffer>>* out,
                  std::vector<std::pair<size_t, rpc::ObjectLocation>>* to_map);
  void SetBlocked(bool blocked);
  // A worker's Get or Wait that is about to block: Block() (without mu_) hands back the tasks
  // queued behind the running one (YieldQueuedTasks) and tells the node (SetBlocked); the node
  // is told again when the scope ends. No lock of its own.
  struct BlockedScope {
    CoreWorker* cw;
    bool on = false;
    void Block();
    ~BlockedScope();
  };

  // Submission. Require mu_.
  void PrepareArgs(std::vector<internal::TaskArg>& args, rpc::TaskSpec* spec,
                   std::vector<std::string>* deps);
  bool DepsReady(const TaskRecord& t);
  // The steps of SubmitTask. SchedulingKey needs no lock (and sets the spec's resources).
  std::string SchedulingKey(const internal::TaskOptions& options,
                            const std::map<std::string, std::string>& selector, rpc::TaskSpec* spec);
  std::unique_ptr<SchedulingQueue> NewSchedulingQueue(
      const std::string& key, const rpc::TaskSpec& spec, const internal::TaskOptions& options,
      const std::map<std::string, std::string>& selector, const std::string& runtime_key);
  // The owned return objects of a new task (num_returns of them, ids ReturnIdOf(first, i));
  // names the task after the first, which it returns. Requires mu_.
  std::string NewReturnObject(rpc::TaskSpec* spec, int num_returns);
  // Pins the task's refs until it ends and counts the owned ones not yet ready. Requires mu_.
  void TrackArgs(const std::shared_ptr<TaskRecord>& t, const std::vector<std::string>& refs);
  // The dependency part of TrackArgs: owned arguments not ready yet hold the task back.
  void WaitForArgs(const std::shared_ptr<TaskRecord>& t);
  void FillResolvedArgs(TaskRecord& t);
  void OnObjectReady(const std::string& id);
  // Streams given tasks while mu_ was held, flushed (Conn::Flush) when the outbox is destroyed:
  // declared before the lock, it outlives it, so a submitting thread writes a synchronous call
  // itself after releasing mu_. Pumps without an outbox wake the streams' writers instead.
  class Outbox {
   public:
    Outbox() = default;
    Outbox(const Outbox&) = delete;
    Outbox& operator=(const Outbox&) = delete;
    ~Outbox() {
      for (auto& e : conns_) {
        e.conn->Flush(e.direct);
        if (e.direct) NoteSyncCall(e.conn, e.task);
      }
    }
    // `direct`: `task` (TaskCounterOf its id) is the only call in flight on `c`.
    void Add(std::shared_ptr<Conn> c, bool direct, uint64_t task = 0) {
      conns_.push_back({std::move(c), direct, task});
    }

   private:
    struct Entry {
      std::shared_ptr<Conn> conn;
      bool direct;
      uint64_t task;
    };
    std::vector<Entry> conns_;
  };
  // The synchronous call this thread sent last (Outbox): a Get of its result on this thread
  // reads the reply off the stream itself (Conn::ReadHere). No lock.
  static void NoteSyncCall(const std::shared_ptr<Conn>& conn, uint64_t task);
  // Requires mu_, released meanwhile unless kNotTried. Reads the reply of the synchronous call
  // that returns `id` on this thread, when this thread sent it and it is in flight on a lane.
  // kAgain: look for `id` again (a batch was read); kFailed: another thread reads or nothing
  // came in time (*mine: that stream); either way the lock was released, so look again before
  // sleeping on cv_.
  enum class SyncRead { kNotTried, kAgain, kFailed };
  SyncRead ReadSyncReply(std::unique_lock<std::mutex>& lock, const std::string& id,
                         std::chrono::steady_clock::time_point deadline, const Conn** mine);
  // Requires mu_: before sleeping on cv_ for results, parked readers read again (Conn::Unpark),
  // but `except`'s.
  void UnparkReaders(const Conn* except = nullptr);
  void Enqueue(std::shared_ptr<TaskRecord> t, Outbox* out = nullptr);
  void PumpQueue(SchedulingQueue& q, Outbox* out = nullptr);
  int PipelineDepth(const SchedulingQueue& q, const std::string& function) const;
  void RequestLease(SchedulingQueue& q);
  void LeaseThread(std::string key, rpc::LeaseRequest req, std::string node_address, int spread);
  // Asks *node_address for a worker, following spillbacks; OK once *reply grants one, else why
  // not (kUnavailable: a node could not be reached). No lock.
  Status RequestLeaseFrom(rpc::LeaseRequest& req, std::string* node_address,
                               rpc::LeaseReply* reply);
  // A node answered `req` as infeasible: warns the user (once per function and resources; takes
  // mu_) and clears req.report_infeasible, so that asked again the node holds it.
  void WarnInfeasible(rpc::LeaseRequest& req);
  void ReturnLease(Conn* conn, bool worker_dead);
  // The steps of OnConnBroken. DetachConn requires mu_: takes the broken stream out of the
  // queues and hands it to housekeeping; returns its in-flight tasks. The others take mu_.
  std::vector<std::shared_ptr<TaskRecord>> DetachConn(Conn* conn);
  void FailActorCalls(const std::string& actor_id, const std::string& worker_id,
                      const std::vector<std::shared_ptr<TaskRecord>>& lost, const std::string& why);
  void RetryLostTasks(const std::vector<std::shared_ptr<TaskRecord>>& lost,
                      const std::string& worker_id, const std::string& node_address,
                      const std::string& why);
  void RetryOrFail(std::shared_ptr<TaskRecord> t, const std::string& why, Conn* conn,
                   StatusCode code = StatusCode::kWorkerDied);
  void PumpActor(ActorQueue& a, Outbox* out = nullptr);
  // Asks the head where the actor lives until it is ALIVE in a worker other than `lost_worker`
  // or DEAD; then connects (or fails the waiting calls). No lock held on entry.
  void ResolveActor(const std::string& actor_id, const std::string& lost_worker);
  // `result`: the executor's reply when one came back (its times go to the task's listing).
  void FailTask(TaskRecord& t, StatusCode code, const std::string& msg,
                const rpc::TaskResult* result = nullptr);
  // Another attempt of `t` (its pins go with it), marked PENDING. Requires mu_.
  std::shared_ptr<TaskRecord> NextAttempt(const TaskRecord& t);
  // Queues NextAttempt(t). Requires mu_.
  void Resubmit(const TaskRecord& t);
  static std::string CancelMessage(const TaskRecord& t);
  // The steps of Cancel. CancelUnsent requires mu_: cancels the task if it was not sent yet;
  // false if it was. CancelRunning requires mu_: marks the running task cancelled and says
  // where it runs (found: false if nowhere). SendCancelTask takes no lock.
  bool CancelUnsent(const std::string& object_id, bool force);
  struct RunningTask {
    bool found = false;
    std::string worker_address, task_id, worker_id, node_address;
  };
  RunningTask CancelRunning(const std::string& object_id, bool force);
  void SendCancelTask(const std::string& address, const std::string& task, bool recursive,
                      bool force, int timeout_ms);
  // Sets the job's settings in `spec`: the default actor lifetime and, with_env, env_vars (the
  // parent's, i.e. the job's in a driver or the running task's/actor's in a worker, with
  // those of `serialized_runtime_env` merged over them). Throws RayRuntimeEnvException.
  void SetJobConfig(const std::string& serialized_runtime_env, rpc::TaskSpec* spec,
                    bool with_env = true);
  // Requires mu_. ResultBatch.requeue_from: takes the tasks of `conn` from stream position
  // `from` on back into `q` and holds the stream until its blocked task is done.
  void RequeueYielded(Conn* conn, SchedulingQueue& q, uint64_t from);
  void ReleaseTaskPins(TaskRecord& t);
  void HousekeepingLoop();
  // Marks the leases idle past the linger time returned and lists them; returns when the next
  // one's linger ends (max: none is lingering). Requires mu_.
  std::chrono::steady_clock::time_point CollectIdleLeases(std::vector<Conn*>* to_return);
  // Requires mu_: a lease went idle or a connection broke.
  void WakeHousekeeping();
  std::unique_ptr<rpc::Node::Stub> NodeStub(const std::string& address);

  // constant after Create
  CoreWorkerOptions opts_;
  std::string address_;
  std::string node_id_;
  std::string session_dir_;
  std::string shm_prefix_;
  std::shared_ptr<Mapping> arena_;  // this node's object store, mapped read-write
  std::string executable_;
  std::string runtime_key_;
  std::vector<std::string> python_command_;  // opts_.python_worker_command or the default
  std::string python_runtime_key_;           // "cmd:" + python_command_
  std::unique_ptr<LaneServer> lane_;  // workers: PushTasks over the lane (docs/wire.md)
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<rpc::Node::Stub> node_;
  std::unique_ptr<HeadClient> head_;  // set by Connect; after node_: its refresh calls the node

  std::mutex mu_;
  std::condition_variable cv_;  // object readiness, lease/conn changes
  // guarded by mu_
  std::unordered_set<std::string> infeasible_warned_;  // WarnInfeasible's: description|resources
  ReferenceCounter refs_;  // the objects this process knows, and their counts
  std::unordered_multimap<std::string, std::shared_ptr<TaskRecord>> waiting_on_;  // dep -> task
  std::map<std::string, std::unique_ptr<SchedulingQueue>> queues_;
  std::unordered_map<std::string, std::unique_ptr<ActorQueue>> actors_;
  std::list<std::shared_ptr<Conn>> conns_;
  std::vector<std::shared_ptr<Conn>> dead_conns_;
  uint64_t next_object_ = 0;
  std::unordered_map<std::string, double> exec_avg_us_;  // EWMA of user-code time per function
  // What this process submitted, for `torus list tasks`; finished entries are kept up to a bound.
  // `conn`: the worker it was sent to (RUNNING) or came back from; `result`: the executor's
  // report, whose times replace the submitter's dispatch and end times (`torus timeline`).
  void SetTaskState(const rpc::TaskSpec& spec, rpc::TaskInfo::State state, Conn* conn = nullptr,
                    const std::string& error = "", const rpc::TaskResult* result = nullptr);
  struct TaskEntry {  // one row of `torus list tasks` (rpc::TaskInfo), without per-field heap strings
    std::string name, actor_id, job_id, error;
    std::shared_ptr<const Conn::Place> place;  // the worker it was last sent to
    rpc::TaskInfo::State state = rpc::TaskInfo::PENDING_ARGS;
    int attempt = 0;
    int64_t submitted_ms = 0;
    int64_t start_us = 0, end_us = 0;
  };
  std::unordered_map<uint64_t, TaskEntry> task_table_;  // by the task id's counter part
  std::deque<uint64_t> finished_tasks_;
  std::array<int64_t, 5> tasks_in_state_{};  // task_table_'s rows by state (TaskInfo::State)
  int64_t tasks_finished_ = 0, tasks_failed_ = 0;  // ever, in this process
  int blocked_depth_ = 0;

  // worker side
  std::unique_ptr<TaskExecutor> task_executor_;  // runs pushed tasks (null in drivers)
  std::atomic<bool> exit_requested_{false};

  // The job context of the most recent task (workers), guarded by log_mu_.
  std::string DriverAddress();
  std::mutex log_mu_;
  std::string current_driver_, current_job_, current_namespace_;
  bool current_default_detached_ = false;
  std::map<std::string, std::string> current_env_vars_;  // of this process (task or actor)
  std::unique_ptr<LogForwarder> log_forwarder_;  // workers, once CaptureOutput() ran

  // Set once Connect() has finished; handlers wait for it.
  std::mutex ready_mu_;
  std::condition_variable ready_cv_;
  bool ready_ = false;

  // Helper threads that use `this` are tracked, and their RPCs cancellable, so Shutdown() can
  // end them before the object goes away.
  void SpawnTracked(std::function<void()> fn);
  std::unique_ptr<grpc::ClientContext> TrackedContext(int64_t deadline_ms = 0);
  void ReleaseContext(grpc::ClientContext* ctx);
  std::mutex track_mu_;
  std::list<std::pair<std::thread, std::shared_ptr<std::atomic<bool>>>> tracked_;
  std::set<grpc::ClientContext*> live_ctx_;

  std::atomic<bool> shutting_down_{false};
  std::thread housekeeping_thread_;
  std::thread borrow_thread_;
  std::condition_variable borrow_cv_;  // with mu_: releases queued, or shutdown
  std::atomic<bool> term_requested_{false};  // workers: SIGTERM received
  // Workers: RunWorkerLoop sleeps in poll() on wake_fd_ (an eventfd: Exit, ExitSoon and the
  // SIGTERM handler write to it) and on a pidfd of its node; nothing polls on a timer.
  int wake_fd_ = -1;
  const pid_t node_pid_ = getppid();    // workers: the node that started us
  std::atomic<int64_t> exit_at_ms_{0};  // ExitSoon: steady-clock ms after which to end
  void WakeWorkerLoop();
  // With mu_: wakes housekeeping (WakeHousekeeping, shutdown). Its own condition variable: cv_
  // is signalled for object readiness, which would wake it on every result.
  std::condition_variable hk_cv_;
  // Guarded by mu_: when housekeeping wakes by itself (max: it waits for a wake-up; min: it is
  // running and rescans before it sleeps again).
  std::chrono::steady_clock::time_point hk_wakes_at_ = std::chrono::steady_clock::time_point::min();
  // Fire-and-forget RPCs (FreeObjects, ReturnLease): never waits for mu_, so posting with mu_
  // held is safe. Stopped (drained and joined) at the end of Shutdown().
  std::unique_ptr<WorkQueue> rpc_work_;

};

}  // namespace torus::core
