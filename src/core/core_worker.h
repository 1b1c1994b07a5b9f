// The core library inside every driver and worker process: owns the objects this process
// creates, submits tasks (leasing workers from nodes, pushing task batches over one stream per
// leased worker) and actor calls (one stream per actor), and, in workers, executes what is
// pushed to it. Implements torus::internal::Runtime for the header-only API.
//
// THREADS
//  - user threads call the Runtime methods; state is guarded by mu_ (objects, submit queues).
//  - one writer and one reader thread per outgoing stream (Conn): the writer drains the
//    connection's send queue into one TaskBatch per Write (natural batching under load); the
//    reader stores results and fails/retries in-flight work when the stream breaks.
//  - lease threads: one per outstanding lease request (RequestLease blocks at the node).
//  - housekeeping thread: returns leases idle for longer than the linger time.
//  - workers only: gRPC server threads read pushed batches; an executor thread (or a pool of
//    max_concurrency threads for a threaded actor) runs user code; one writer per inbound stream.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
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
#include "core/reference_counter.h"
#include "proto/torus.grpc.pb.h"
#include "torus/internal/runtime.h"

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
  // Called once connected, before any pushed work runs (workers publish the runtime here, so the
  // first task can already use the API).
  std::function<void(CoreWorker*)> on_ready;
};

class Conn;
struct TaskRecord;
struct ActorQueue;
struct SchedulingQueue;
class Executor;

class CoreWorker final : public internal::Runtime, public rpc::CoreWorker::Service {
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
  std::vector<std::shared_ptr<internal::Buffer>> Get(const std::vector<std::string>& ids,
                                                     int timeout_ms) override;
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
  std::string JobId();

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
  // The body of PushTasks, for a gRPC stream or a lane stream.
  template <class Stream>
  grpc::Status ServeTasks(Stream* stream);
  grpc::Status GetObject(grpc::ServerContext*, const rpc::GetObjectRequest*,
                         rpc::GetObjectReply*) override;
  grpc::Status BorrowObjects(grpc::ServerContext*, const rpc::BorrowObjectsRequest*,
                             rpc::BorrowObjectsReply*) override;
  grpc::Status Exit(grpc::ServerContext*, const rpc::Empty*, rpc::Empty*) override;
  grpc::Status PrintLogs(grpc::ServerContext*, const rpc::LogBatch*, rpc::Empty*) override;
  grpc::Status ListTasks(grpc::ServerContext*, const rpc::Empty*, rpc::TaskList*) override;
  grpc::Status CheckLease(grpc::ServerContext*, const rpc::CheckLeaseRequest*,
                          rpc::CheckLeaseReply*) override;

  // Workers: sends what user code writes to stdout/stderr (fds 1 and 2) to the driver of the
  // work being run, besides the worker's log files. Call once, early.
  void CaptureOutput();

  // Called by Conn threads.
  void OnResults(Conn* conn, rpc::ResultBatch& batch);
  void OnConnBroken(Conn* conn, const std::string& why);

  // Executes one task in this worker; fills *result. Called on executor threads.
  void Execute(const rpc::TaskSpec& spec, rpc::TaskResult* result);

 private:
  explicit CoreWorker(CoreWorkerOptions opts);
  Status Connect();

  std::string NewObjectId();
  std::string PutBytes(std::string bytes, std::vector<std::string> nested);
  // Object store. Require mu_.
  void StoreResult(const std::string& id, rpc::TaskResult& r);  // takes the value out of r
  // Frees store segments in the background (fire and forget). Any lock.
  void FreeInStore(ReferenceCounter::FreeRequest r);
  // Borrowed references (docs/objects.md); the counting is refs_'s.
  // One BorrowObjects call to `owner`; adds the ids it does not own to *unknown. No lock.
  grpc::Status CallBorrow(const std::string& owner, const std::string& borrower, int delta,
                          const std::vector<std::string>& ids, std::set<std::string>* unknown,
                          int deadline_ms, bool cancellable = true);
  // Executor side: registers `submitter` as a borrower of each id (with their owners) and lists
  // the registered ones in result->nested_ids. No lock.
  void RegisterResultBorrows(const std::string& submitter, std::vector<std::string> ids,
                             rpc::TaskResult* result);
  // No lock. Sends queued releases; probes borrowers and drops those that are gone.
  void BorrowLoop();
  void FlushBorrowReleases(int deadline_ms, bool cancellable);
  void ProbeBorrowers();
  // No lock. Gives back every registration this process holds (clean exit).
  void ReleaseAllBorrows(int deadline_ms);
  // Executor side: registers with the owners of the refs inside the task's arguments (one call
  // per owner) and pins them for the task's duration; UnpinArgBorrows ends that. No lock.
  std::vector<std::string> PinArgBorrows(const rpc::TaskSpec& spec);
  void UnpinArgBorrows(const std::vector<std::string>& pinned);
  void FailObject(const std::string& id, StatusCode code, const std::string& msg);
  // Location of a value we hold, for an Arg or a GetObject reply. Require mu_.
  bool LocationOf(const std::string& id, rpc::ObjectLocation* loc, bool* is_error,
                  rpc::Error* err);
  // Fetch a borrowed object from its owner in the background (no lock held by caller? holds mu_).
  void EnsureFetching(const std::string& id);
  void FetchFromOwner(const std::string& id);
  // Turns a stored location into readable bytes (maps shm, pulls from other nodes). No lock.
  // Reserves `size` bytes under `key` in this node's store. No lock.
  StatusOr<rpc::ObjectLocation> CreateInStore(const std::string& object_id, const std::string& key,
                                              uint64_t size, const std::string& owner);
  StatusOr<std::shared_ptr<internal::Buffer>> Materialize(const rpc::ObjectLocation& loc,
                                                          const std::string& object_id);
  void ThrowIfError(const std::string& id, const ObjectEntry& e);
  void SetBlocked(bool blocked);

  // Submission. Require mu_.
  void PrepareArgs(std::vector<internal::TaskArg>& args, rpc::TaskSpec* spec,
                   std::vector<std::string>* deps);
  bool DepsReady(const TaskRecord& t);
  void FillResolvedArgs(TaskRecord& t);
  void OnObjectReady(const std::string& id);
  void Enqueue(std::shared_ptr<TaskRecord> t);
  void PumpQueue(SchedulingQueue& q);
  int PipelineDepth(const std::string& function) const;
  void RequestLease(SchedulingQueue& q);
  void LeaseThread(std::string key, rpc::LeaseRequest req, std::string node_address);
  void ReturnLease(Conn* conn, bool worker_dead);
  void RetryOrFail(std::shared_ptr<TaskRecord> t, const std::string& why, Conn* conn,
                   StatusCode code = StatusCode::kWorkerDied);
  void PumpActor(ActorQueue& a);
  void ResolveActor(const std::string& actor_id, int min_restarts);
  void FailTask(TaskRecord& t, StatusCode code, const std::string& msg);
  // Sets the job's settings in `spec`: the default actor lifetime and, with_env, env_vars (the
  // parent's, i.e. the job's in a driver or the running task's/actor's in a worker, with
  // those of `serialized_runtime_env` merged over them). Throws RayRuntimeEnvException.
  void SetJobConfig(const std::string& serialized_runtime_env, rpc::TaskSpec* spec,
                    bool with_env = true);
  void ReleaseTaskPins(TaskRecord& t);
  void HousekeepingLoop();
  // Node address of a bundle able to hold `res` (bundle_index -1: any). No lock; asks the head.
  StatusOr<std::string> BundleNode(const std::string& pg_id, int bundle_index, const ResourceMap& res);
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
  std::unique_ptr<LaneServer> lane_;  // workers: PushTasks over the lane (docs/wire.md)
  LeaseUse lease_use_;  // workers: the leases their task streams carry (own lock)
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<rpc::Head::Stub> head_;
  std::unique_ptr<rpc::Node::Stub> node_;

  std::mutex mu_;
  std::condition_variable cv_;  // object readiness, lease/conn changes
  // guarded by mu_
  ReferenceCounter refs_;  // the objects this process knows, and their counts
  std::unordered_set<std::string> created_pgs_;  // placement groups placed during our Create call
  std::unordered_multimap<std::string, std::shared_ptr<TaskRecord>> waiting_on_;  // dep -> task
  std::map<std::string, std::unique_ptr<SchedulingQueue>> queues_;
  std::unordered_map<std::string, std::unique_ptr<ActorQueue>> actors_;
  std::list<std::unique_ptr<Conn>> conns_;
  std::vector<std::unique_ptr<Conn>> dead_conns_;
  uint64_t next_object_ = 0;
  std::unordered_map<std::string, double> exec_avg_us_;  // EWMA of user-code time per function
  // What this process submitted, for `torus list tasks`; finished entries are kept up to a bound.
  void SetTaskState(const rpc::TaskSpec& spec, const char* state, const std::string& worker = "",
                    const std::string& error = "");
  struct TaskEntry {  // one row of `torus list tasks` (rpc::TaskInfo), without per-field heap strings
    std::string name, actor_id, job_id, worker_id, error;
    const char* state = "";
    int attempt = 0;
    int64_t submitted_ms = 0;
  };
  std::unordered_map<uint64_t, TaskEntry> task_table_;  // by the task id's counter part
  std::deque<uint64_t> finished_tasks_;
  int blocked_depth_ = 0;

  // worker side
  std::unique_ptr<Executor> executor_;
  std::atomic<bool> exit_requested_{false};
  internal::ActorInstance actor_;
  std::string actor_id_;
  bool actor_restarted_ = false;
  std::atomic<bool> actor_exiting_{false};  // ExitActor() called: refuse further calls
  std::atomic<int> max_concurrency_{1};
  std::mutex exec_mu_;  // held while a task runs on a sequential worker or actor

  // Output forwarding (workers). The driver of the most recent task, guarded by log_mu_.
  std::string DriverAddress();
  void ForwardLoop();
  std::mutex log_mu_;
  std::string current_driver_, current_job_, current_namespace_;
  bool current_default_detached_ = false;
  std::map<std::string, std::string> current_env_vars_;  // of this process (task or actor)
  std::vector<std::string> out_lines_, err_lines_;

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
  std::mutex hk_mu_;  // only for hk_cv_: wakes housekeeping at shutdown
  std::condition_variable hk_cv_;
  // Drivers: a WatchJob call held open so the head notices if this process dies.
  std::unique_ptr<grpc::ClientContext> watch_ctx_;
  std::thread watch_thread_;
};

}  // namespace torus::core
