// WorkerPool: the node's worker processes. Starts them (`torus worker` or the driver's own
// executable in worker mode, with the node's, the chips' and the bundle's environment), keys
// them by what they can run (job + runtime key + chips + bundle environment: a worker only ever
// runs work whose key it was started with, so never two jobs' work), finds idle ones (most
// recently used first), picks long idle ones and those of finished jobs to stop, and remembers
// how the last 10,000 ended (GetWorkerExit).
//
// Warm workers: for a Python driver the pool keeps a few idle workers of the driver's job key
// ready (SetWarm at the driver's registration; Refill after an actor takes one), so that the
// driver's first actors and tasks find an interpreter already started and imported. They are
// never stopped for being idle, and go with the job (JobFinished).
//
// It decides nothing about resources (the Ledger's) or leases (the Node's): a Worker's `hold`
// and lease fields are written by the node.
//
// THREADS: not thread-safe on its own. The node owns one WorkerPool guarded by its mutex
// (the pool is a member GUARDED_BY it); every method is called with it held. Start() wakes
// the reaper's ChildExitWaiter (thread-safe, not guarded) so a new worker's exit is seen.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/head_addresses.h"
#include "common/process.h"
#include "common/status.h"
#include "node/ledger.h"
#include "node/log_files.h"
#include "proto/torus.pb.h"

namespace torus {

enum class WorkerState { kStarting, kIdle, kLeased, kActor, kDriver };

// A worker's state as `torus list workers` and the node's metrics show it (rpc::WorkerInfo).
inline rpc::WorkerInfo::State WireState(WorkerState s) {
  switch (s) {
    case WorkerState::kStarting: return rpc::WorkerInfo::STARTING;
    case WorkerState::kIdle: return rpc::WorkerInfo::IDLE;
    case WorkerState::kLeased: return rpc::WorkerInfo::LEASED;
    case WorkerState::kActor: return rpc::WorkerInfo::ACTOR;
    case WorkerState::kDriver: return rpc::WorkerInfo::DRIVER;
  }
  return rpc::WorkerInfo::STARTING;
}

struct Worker {
  std::string id;
  pid_t pid = 0;
  std::string address;
  std::string runtime_key;
  std::string job_id;  // the job it serves
  WorkerState state = WorkerState::kStarting;
  std::string lease_id;
  std::string actor_id;
  bool actor_ready = false;  // the actor's constructor returned (ActorStarter)
  Hold hold;  // resources and chips held by its lease or actor
  bool kill_requested = false;
  std::string end_reason;  // why the node ended it ("SliceLost: ..."), reported to its users
  std::chrono::steady_clock::time_point idle_since;
  std::string reserved_for;  // actor id: started for that actor, not for task leases
  std::chrono::steady_clock::time_point leased_at;  // when lease_id was granted
  bool lease_in_use = false;  // the worker said a stream of the holder carries lease_id
};

// What a worker process is started with, beyond its key.
struct WorkerSpawn {
  std::string job_id;  // the job whose work it runs (part of its key)
  std::string exe;
  std::vector<std::string> code_path;  // non-empty: `torus worker` with this search path
  // Non-empty: the whole command line (Python workers: the interpreter and its bootstrap);
  // exe and code_path are then unused.
  std::vector<std::string> command;
  std::vector<int> chips;              // its TPU_VISIBLE_CHIPS
  std::vector<int> gpus;               // its CUDA_VISIBLE_DEVICES (Ray's GPU ids)
  std::string reserved_for;            // actor id: task leases never take it
  const Ledger::Bundle* bundle = nullptr;  // its MEGASCALE_* environment
  const google::protobuf::Map<std::string, std::string>* env_vars = nullptr;  // runtime_env
};

// What every worker of this node is told (constant once the node has registered).
struct WorkerPoolConfig {
  std::string node_id;
  std::string node_address;
  std::string bind_host;
  std::string token;
  std::string session_dir;
  std::shared_ptr<HeadAddresses> heads;  // the node's (node.h); workers get heads->joined()
  std::string torus_exe;
  std::string logs_dir;  // "" = <session_dir>/logs
  int num_chips = 0;     // this host's chips (chip visibility)
  LogFiles* log_files = nullptr;  // claims each worker's .out/.err (not owned; outlives the pool)
};

class WorkerPool {
 public:
  // `reaper` (not owned, outlives the pool): woken when a worker starts.
  explicit WorkerPool(ChildExitWaiter* reaper) : reaper_(reaper) {}
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Set once at the node's Start, before any worker starts.
  void Configure(WorkerPoolConfig cfg) { cfg_ = std::move(cfg); }

  // Worker key for `job_id`'s work of this runtime key: a worker serves one job.
  static std::string JobKey(const std::string& job_id, const std::string& runtime_key) {
    return job_id + "|" + runtime_key;
  }
  // At most this many warm workers per job key (RegisterWorkerRequest.warm_workers).
  static constexpr int kMaxWarmWorkers = 16;

  // Worker key for work holding `chips`: workers are started with their chips' env.
  static std::string ChipKey(const std::string& key, const std::vector<int>& chips);
  // Worker key for work holding `h`: its chips and its GPUs (CUDA_VISIBLE_DEVICES).
  static std::string HoldKey(const std::string& key, const Hold& h);

  // Spawns a worker for `key`; it counts as starting until Registered (unless reserved).
  StatusOr<Worker*> Start(const std::string& key, const WorkerSpawn& spawn);
  // The worker's first call: it idles (true), or it was not started here (false).
  bool Registered(const std::string& id, const std::string& address);
  void AddDriver(const std::string& id, pid_t pid, const std::string& address);
  // The most recently idle worker of `key` that is free for leases, or null.
  Worker* FindIdle(const std::string& key);
  // Keep `count` (capped at kMaxWarmWorkers; 0 = none) idle workers of `key` ready, started as
  // `spawn` (its job, command and env_vars; no chips, bundle or reservation) until that job
  // finishes. Call Refill to start them.
  void SetWarm(const std::string& key, const WorkerSpawn& spawn, int count);
  // Starts workers of the warm keys that have fewer than their count idle, leased to tasks or
  // starting; returns the first failure (the others are still tried). Does nothing until
  // kWarmRefillDelay after the last WarmTaken: a burst of actors (a Serve application's
  // controller, proxy and replicas) takes the warm workers without new interpreters starting
  // beside it on the same cores.
  Status Refill();
  // An actor took a worker (perhaps a warm one): Refill waits kWarmRefillDelay from now.
  void WarmTaken();
  static constexpr std::chrono::milliseconds kWarmRefillDelay{500};
  // A warm key's worker still starting, now reserved for `actor_id` (task leases never take it;
  // it idles for that actor once registered), or null. Only warm keys' workers are claimed; a
  // lease that counted on the one taken starts another when the next worker registers.
  Worker* ClaimStarting(const std::string& key, const std::string& actor_id);
  Worker* Find(const std::string& id);
  // Workers of `key` being started for leases.
  int Starting(const std::string& key) const;
  // Idle workers of finished jobs, and idle workers above `keep` idle longer than `keep_for`:
  // marked to stop, their pids returned.
  std::vector<pid_t> PickIdleToStop(int keep, std::chrono::milliseconds keep_for);
  // `job_id` ended: its workers are stopped once idle (the last 1,024 ended jobs are kept).
  void JobFinished(const std::string& job_id);
  bool IsFinished(const std::string& job_id) const { return finished_.count(job_id) > 0; }
  // Marks every worker (not drivers) to stop and warms no key any more; returns their pids.
  std::vector<pid_t> StopAll();

  // Pids of this pool's own processes (the reaper waits on these only).
  std::vector<pid_t> Pids() const;
  // True while `pid` is one of them (not yet reaped).
  bool HasPid(pid_t pid) const { return by_pid_.count(pid) > 0; }
  // The worker `pid` belonged to, removed from the table (null when not ours).
  std::unique_ptr<Worker> TakeExited(pid_t pid);
  // Records how worker `id` ended (and a StatusCode when the node ended it for a reason).
  void RecordExit(const std::string& id, const std::string& description, int code);
  // How worker `id` ended; false when it has not (or is too old to remember).
  bool LookupExit(const std::string& id, std::string* description, int* code) const;
  bool Known(const std::string& id) const { return workers_.count(id) > 0; }

  const std::unordered_map<std::string, std::unique_ptr<Worker>>& workers() const { return workers_; }

 private:
  ChildExitWaiter* const reaper_;
  WorkerPoolConfig cfg_;
  std::unordered_map<std::string, std::unique_ptr<Worker>> workers_;  // by worker id
  std::unordered_map<pid_t, std::string> by_pid_;
  std::map<std::string, int> starting_by_key_;
  struct Warm {
    std::string job_id;
    std::vector<std::string> command;
    std::map<std::string, std::string> env_vars;
    int count = 0;
    int failures = 0;  // its workers that exited before registering
  };
  static constexpr int kMaxWarmFailures = 3;
  std::map<std::string, Warm> warm_;  // by worker key (SetWarm)
  std::chrono::steady_clock::time_point warm_taken_at_;  // WarmTaken
  std::set<std::string> finished_;        // jobs that ended (JobFinished)
  std::deque<std::string> finished_order_;  // the same, oldest first (bounds finished_)
  std::map<std::string, std::string> exits_;  // worker id -> how it ended
  std::map<std::string, int> exit_codes_;      // worker id -> StatusCode when ended for a reason
  std::deque<std::string> exit_order_;
};

}  // namespace torus
