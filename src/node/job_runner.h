// JobRunner: the processes of submitted jobs (docs/jobs.md) that the head asks this node to run.
// Served on the node's port next to rpc::Node. Each process runs in its own session (process
// group) with its stdout and stderr in one file under <session>/logs; the head tails it.
//
// THREADS: gRPC server threads run the handlers (TailProcess polls the output file and blocks
// its thread while the process runs: the output file is polled every 20 ms, as appends to a
// file signal nothing); one reaper thread waitpid()s this runner's processes (asleep on their
// pidfds until one exits, a start or stop wakes it, or the next kill deadline), sends SIGKILL
// when a stop's grace period ends, and sleeps on cv_ while none runs. Stop() joins it. All state
// is guarded by mu_.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/process.h"
#include "common/status.h"
#include "node/log_files.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

struct JobRunnerConfig {
  std::string node_id;
  std::string token;
  std::string bind_host = "127.0.0.1";
  int num_tpu_chips = 0;         // chips of this host (for whole-host chip visibility)
  LogFiles* log_files = nullptr; // claims each job process's output (not owned; outlives this)
};

class JobRunner final : public rpc::JobRunner::Service {
 public:
  explicit JobRunner(JobRunnerConfig cfg);
  ~JobRunner() override;
  JobRunner(const JobRunner&) = delete;
  JobRunner& operator=(const JobRunner&) = delete;

  // Where output files go (<dir>/logs/job-...). Set once the node knows its session.
  void SetSessionDir(const std::string& dir);
  // Stops every process (SIGTERM, SIGKILL after 1.5 s), ends tails. Idempotent, any thread.
  void Stop();

  grpc::Status StartProcess(grpc::ServerContext*, const rpc::JobProcessSpec*,
                            rpc::JobProcessStartReply*) override;
  grpc::Status StopProcess(grpc::ServerContext*, const rpc::JobProcessRef*, rpc::Empty*) override;
  grpc::Status TailProcess(grpc::ServerContext*, const rpc::JobProcessTailRequest*,
                           grpc::ServerWriter<rpc::JobProcessOutput>*) override;
  grpc::Status PickPort(grpc::ServerContext*, const rpc::Empty*, rpc::PickPortReply*) override;

 private:
  struct Proc {
    std::string job_id;
    pid_t pid = 0;
    std::string output_path;
    bool exited = false;
    std::string description;
    int exit_code = -1;
    std::chrono::steady_clock::time_point kill_at = std::chrono::steady_clock::time_point::max();
  };
  void ReapLoop();

  // constant after construction
  JobRunnerConfig cfg_;

  std::mutex mu_;
  std::condition_variable cv_;
  ChildExitWaiter waiter_;  // the reaper sleeps here while processes run
  // guarded by mu_
  std::string session_dir_;
  std::map<std::string, Proc> procs_;  // by process id; kept after exit for late tails
  std::atomic<bool> stopping_{false};
  std::thread reaper_;
};

}  // namespace torus
