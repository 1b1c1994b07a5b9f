// JobManager: submitted jobs (`torus job submit`, docs/jobs.md), supervised inside the head so a
// job outlives the client that submitted it. Served on the head's port next to rpc::Head.
//
// A job is one driver process on one node, or (with a slice request) one process on every host
// of a whole-slice reservation, gang-launched. Each attempt reserves the slices through the
// head's own placement-group service (a loopback RPC, the same path as
// torus::tpu::CreateSlicePlacementGroup), starts the processes through the JobRunner service of
// each node, tails their output into <session>/logs/job-<id>.log (prefixed by host for gang
// jobs) and ends the attempt at the first failure, stopping the others and releasing the slices.
//
// Durable (with a store, head/head_store.h): every change to a job's record is written before
// it shows, and the progress of its log copy at most every 500 ms; a resumed head (Restore)
// tails the processes of a RUNNING job on from the saved offsets (the log cut back to the saved
// size), so the job keeps running and its log has every byte once.
//
// THREADS: gRPC and HTTP server threads call the API; each job has one supervisor thread, which runs
// one tail thread per process of the current attempt. Job state (jobs_) is guarded by mu_;
// appends to the log files and the copy's progress by log_mu_ (taken after mu_ when both are
// held). The methods marked EXCLUDES(mu_) take mu_ themselves.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "common/thread_annotations.h"
#include "head/head_store.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

struct JobManagerConfig {
  std::string token;
  std::string session_dir;  // "" = a directory under the system temp dir
  HeadStore* store = nullptr;  // durable state (null: memory only); outlives the manager
};

class JobManager final : public rpc::Jobs::Service {
 public:
  explicit JobManager(JobManagerConfig cfg);
  ~JobManager() override;
  JobManager(const JobManager&) = delete;
  JobManager& operator=(const JobManager&) = delete;

  // The head's own address (drivers get it as TORUS_ADDRESS; reservations are made through it).
  // Call once, before the server accepts calls from clients.
  void SetHeadAddress(const std::string& address) { head_address_ = address; }
  // Stops every running job's processes and joins the supervisors. Idempotent.
  void Stop() EXCLUDES(mu_);
  // A resumed head: takes over the jobs of the store (kJob records); running ones are tailed on
  // and supervised as before. Returns how many; an error if a record is garbled (nothing taken).
  StatusOr<size_t> Restore() EXCLUDES(mu_);
  // From now on Submit takes jobs (before: Unavailable), so that a submission cannot race the
  // Restore of a job with the same id. The head calls it after Restore.
  void AcceptSubmissions() EXCLUDES(mu_) {
    MutexLock lock(mu_);
    accepting_ = true;
  }

  // The job API both surfaces share (the gRPC service below, the Jobs REST API in jobs_http.h).
  // Callers have checked the token. Errors: InvalidArgument for a bad request, NotFound for an
  // unknown id, AlreadyExists for a submission id taken, FailedPrecondition for deleting a job
  // not finished, Unavailable while the head shuts down.
  //
  // A request may give its command as `entrypoint` (argv) or as `shell_command` (run by
  // /bin/sh -c, as Ray's jobs are); `submission_id` names the job ("" = a new "job_…" id).
  StatusOr<rpc::JobRecord> Submit(const rpc::JobSubmitRequest& req) EXCLUDES(mu_);
  StatusOr<rpc::JobRecord> Get(const std::string& id) EXCLUDES(mu_);
  std::vector<rpc::JobRecord> List() EXCLUDES(mu_);  // by submission time
  // Asks a job to stop (its processes are stopped, the attempt ends as STOPPED); returns the
  // record as it was when asked. Stopping a finished job does nothing.
  StatusOr<rpc::JobRecord> RequestStop(const std::string& id) EXCLUDES(mu_);
  // Forgets a finished job: its record (also in the store) and its log file.
  Status Delete(const std::string& id) EXCLUDES(mu_);
  struct LogRead {
    std::string data;   // the log's bytes from the offset asked, at most max_bytes
    rpc::JobRecord job;  // read before the bytes: when terminal, `data` reached the log's end
  };
  StatusOr<LogRead> ReadLog(const std::string& id, uint64_t offset, size_t max_bytes) EXCLUDES(mu_);
  // Waits until some job changes or its log grows, or `d` passes.
  void WaitForChange(std::chrono::milliseconds d) EXCLUDES(mu_);
  bool stopping() const { return stopping_; }

  grpc::Status SubmitJob(grpc::ServerContext*, const rpc::JobSubmitRequest*, rpc::JobReply*) override;
  grpc::Status GetJob(grpc::ServerContext*, const rpc::JobIdRequest*, rpc::JobReply*) override;
  grpc::Status ListJobs(grpc::ServerContext*, const rpc::Empty*, rpc::JobListReply*) override;
  grpc::Status StopJob(grpc::ServerContext*, const rpc::JobIdRequest*, rpc::JobReply*) override;
  grpc::Status DeleteJob(grpc::ServerContext*, const rpc::JobIdRequest*, rpc::JobDeleteReply*) override;
  grpc::Status JobLogs(grpc::ServerContext*, const rpc::JobLogsRequest*,
                       grpc::ServerWriter<rpc::JobLogChunk>*) override;

 private:
  struct Job {
    rpc::JobRecord rec;
    rpc::JobSubmitRequest req;
    rpc::PlacementGroupRecord slice_request;  // gang jobs: the reservation each attempt makes
    bool stop_requested = false;
    std::string log_path;
    std::thread supervisor;
  };
  enum class Outcome { kSucceeded, kFailed, kStopped };
  struct AttemptResult {
    Outcome outcome = Outcome::kFailed;
    std::string message;
    int exit_code = -1;
  };
  // One process of an attempt: where it runs and as what.
  struct Target {
    int rank = 0;
    int slice_index = 0;
    std::string node_id;
    std::string node_address;
    std::string host;  // output prefix
  };

  // `resume`: the first attempt is the one a previous head started (ResumeAttempt).
  void Supervise(const std::string& id, bool resume = false) EXCLUDES(mu_);
  AttemptResult RunAttempt(const std::string& id) EXCLUDES(mu_);
  // The running attempt of a resumed job: its processes, from the record, tailed on.
  AttemptResult ResumeAttempt(const std::string& id) EXCLUDES(mu_);
  // Writes the job to the store (no-op without one); a failed write is logged.
  void SaveLocked(const std::string& id) REQUIRES(mu_);
  void Save(const std::string& id) EXCLUDES(mu_);
  // Waits for the attempt's reservation; fills targets. Empty message: ready.
  AttemptResult ReserveSlices(const std::string& id, std::string* pg_id, std::vector<Target>* targets);
  AttemptResult PickDriverNode(const std::string& id, std::vector<Target>* targets);
  void RemoveReservation(const std::string& pg_id);
  // One attempt of a job as RunAttempt's steps share it (owned by the supervisor thread).
  struct Attempt {
    std::string id;
    rpc::JobSubmitRequest req;
    bool gang = false;
    std::string pg_id;  // the attempt's reservation ("" for a single driver)
    int epoch = 0;
    std::vector<Target> targets;  // one per process, by rank
    std::vector<std::map<std::string, std::string>> env_set;  // per process
    std::vector<std::vector<std::string>> env_unset;           // per process
    std::vector<rpc::JobProcessStartReply> started;            // per process
    std::vector<uint64_t> start_offsets;  // per process: output already copied (a resumed attempt)
  };
  struct ProcessEnd {  // how one process of an attempt ended (its tail's last event)
    int index;
    bool ok;
    std::string description;
    int exit_code;
  };
  // The steps of RunAttempt, in order (supervisor thread, mu_ not held). A step that returns
  // a result ended the attempt with it.
  Attempt BeginAttempt(const std::string& id);
  std::optional<AttemptResult> BuildEnvironments(Attempt& a);  // gang: picks the coordinator port
  std::optional<AttemptResult> StartProcesses(Attempt& a);     // all start, or those that did stop
  void MarkRunning(const Attempt& a) EXCLUDES(mu_);
  AttemptResult AwaitProcesses(const Attempt& a);  // tails every process until all ended
  ProcessEnd TailProcess(const Attempt& a, int i);  // copies process i's output into the log
  void StopProcess(const Attempt& a, int i);
  void NoteProcessExited(const std::string& id, const ProcessEnd& ev) EXCLUDES(mu_);
  static AttemptResult FailureOf(const Attempt& a, const ProcessEnd& ev);
  // Appends to the job's log; with `proc` >= 0 also notes that process `proc`'s output up to
  // `done` is copied (the progress a resumed head continues from).
  void AppendLog(const std::string& id, const std::string& text, int proc = -1, uint64_t done = 0)
      EXCLUDES(mu_);
  bool StopWanted(const std::string& id) EXCLUDES(mu_);
  void SetMessage(const std::string& id, const std::string& message) EXCLUDES(mu_);

  // constant after construction / SetHeadAddress
  JobManagerConfig cfg_;
  std::string head_address_;
  std::string log_dir_;

  Mutex mu_;
  CondVar cv_;  // job state or log changes
  std::map<std::string, Job> jobs_ GUARDED_BY(mu_);
  // Finished jobs are kept for queries up to kKeepFinishedJobs, the oldest submitted first out
  // (their log files stay). Trimmed in SubmitJob.
  static constexpr size_t kKeepFinishedJobs = 1000;
  void TrimFinishedLocked() REQUIRES(mu_);
  std::atomic<bool> stopping_{false};
  bool accepting_ GUARDED_BY(mu_) = false;

  Mutex log_mu_;  // serialises appends to the job logs; after mu_ when both are held
  struct Progress {
    uint64_t log_size = 0;
    std::vector<uint64_t> offsets;  // per process of the running attempt
  };
  std::map<std::string, Progress> progress_ GUARDED_BY(log_mu_);
};

}  // namespace torus
