#include "head/finished_jobs.h"

#include "common/ids.h"

namespace torus {

FinishedJobs::FinishedJobs(size_t capacity) : capacity_(capacity), epoch_(RandomHex(8)) {}

void FinishedJobs::Add(const std::string& job_id) {
  ++seq_;
  log_.push_back(job_id);
  if (log_.size() > capacity_) log_.pop_front();
}

void FinishedJobs::Fill(const rpc::HeartbeatRequest& req, rpc::HeartbeatReply* reply) const {
  reply->set_jobs_epoch(epoch_);
  reply->set_jobs_seq(seq_);
  if (req.jobs_epoch().empty()) return;  // a node's first beat: it has no older workers
  const uint64_t first = seq_ - log_.size() + 1;  // seq of log_.front()
  uint64_t from = first;  // another epoch, or a place older than the log: all of it
  if (req.jobs_epoch() == epoch_ && req.jobs_seq() + 1 >= first) from = req.jobs_seq() + 1;
  for (uint64_t s = from; s <= seq_; ++s) reply->add_finished_jobs(log_[s - first]);
}

}  // namespace torus
