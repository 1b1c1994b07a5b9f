// FinishedJobs: the jobs that ended, in order, for the nodes. A node stops the idle worker
// processes of a job once it hears the job ended (a worker serves one job only: it keeps that
// job's imports, globals and environment). Each heartbeat carries the node's place in this log
// (epoch, seq) and the reply the job ids it has not seen.
//
// The log keeps the last `capacity` jobs. A node that has never beaten starts at the end (it
// has no workers of older jobs). A node whose place is from another epoch (a restarted head) or
// older than the log's start gets everything kept; older ends it missed are left to the node's
// idle-worker policy.
//
// THREADS: not thread-safe; the head holds its mutex around every call.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>

#include "proto/torus.pb.h"

namespace torus {

class FinishedJobs {
 public:
  explicit FinishedJobs(size_t capacity = 4096);

  void Add(const std::string& job_id);
  // Fills reply's jobs_epoch, jobs_seq and finished_jobs for a node at (req.jobs_epoch, req.jobs_seq).
  void Fill(const rpc::HeartbeatRequest& req, rpc::HeartbeatReply* reply) const;

  const std::string& epoch() const { return epoch_; }

 private:
  const size_t capacity_;
  const std::string epoch_;  // random per head process
  uint64_t seq_ = 0;         // jobs added so far; log_.back() has this seq
  std::deque<std::string> log_;  // the last capacity_ jobs; log_.front() has seq_ - size + 1
};

}  // namespace torus
