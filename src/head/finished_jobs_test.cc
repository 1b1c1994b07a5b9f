#include "head/finished_jobs.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace torus {
namespace {

std::vector<std::string> Beat(const FinishedJobs& log, const std::string& epoch, uint64_t seq,
                              rpc::HeartbeatReply* reply) {
  rpc::HeartbeatRequest req;
  req.set_jobs_epoch(epoch);
  req.set_jobs_seq(seq);
  reply->Clear();
  log.Fill(req, reply);
  return {reply->finished_jobs().begin(), reply->finished_jobs().end()};
}

TEST(FinishedJobsTest, ANodeHearsEachEndOnceInOrder) {
  FinishedJobs log;
  rpc::HeartbeatReply r;
  log.Add("a");
  // A node's first beat: it has no workers of older jobs, so nothing, only its place.
  EXPECT_TRUE(Beat(log, "", 0, &r).empty());
  EXPECT_EQ(r.jobs_epoch(), log.epoch());
  EXPECT_EQ(r.jobs_seq(), 1u);
  log.Add("b");
  log.Add("c");
  EXPECT_EQ(Beat(log, r.jobs_epoch(), r.jobs_seq(), &r), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(r.jobs_seq(), 3u);
  EXPECT_TRUE(Beat(log, r.jobs_epoch(), r.jobs_seq(), &r).empty());  // up to date
}

TEST(FinishedJobsTest, AnotherEpochOrAPlaceOlderThanTheLogGetsAllItKeeps) {
  FinishedJobs log(/*capacity=*/2);
  rpc::HeartbeatReply r;
  for (const char* j : {"a", "b", "c"}) log.Add(j);
  // A place from a head that is gone (the node beat to the old head last).
  EXPECT_EQ(Beat(log, "old-head", 7, &r), (std::vector<std::string>{"b", "c"}));
  // A place older than the log's first entry ("a" fell out).
  EXPECT_EQ(Beat(log, log.epoch(), 0, &r), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(Beat(log, log.epoch(), 1, &r), (std::vector<std::string>{"b", "c"}));
  EXPECT_EQ(Beat(log, log.epoch(), 2, &r), (std::vector<std::string>{"c"}));
  EXPECT_NE(FinishedJobs().epoch(), log.epoch());  // each head process has its own
}

}  // namespace
}  // namespace torus
