#include "node/worker_pool.h"

#include <signal.h>
#include <sys/wait.h>

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

namespace torus {
namespace {

// A pool whose "workers" are `sleep 60` processes: what is tested is the pool's bookkeeping
// (which workers it starts, keeps, hands out and picks to stop), not a worker's protocol.
class WarmPoolTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/torus-pool-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
    WorkerPoolConfig cfg;
    cfg.node_id = "n1";
    cfg.session_dir = dir_;
    cfg.logs_dir = dir_;
    pool_.Configure(cfg);
    spawn_.job_id = "job1";
    spawn_.command = {"/bin/sleep", "60"};
  }
  void TearDown() override {
    for (pid_t p : pool_.StopAll()) {
      kill(p, SIGKILL);
      waitpid(p, nullptr, 0);
    }
    std::string rm = "rm -rf " + dir_;
    (void)std::system(rm.c_str());
  }
  // Registers every starting worker (as each would on its first call); returns how many.
  int RegisterAll() {
    int n = 0;
    std::vector<std::string> ids;
    for (const auto& [id, w] : pool_.workers()) {
      if (w->state == WorkerState::kStarting) ids.push_back(id);
    }
    for (const auto& id : ids) n += pool_.Registered(id, "127.0.0.1:1");
    return n;
  }
  int Count(WorkerState s) const {
    return static_cast<int>(std::count_if(pool_.workers().begin(), pool_.workers().end(),
                                          [s](const auto& kv) { return kv.second->state == s; }));
  }

  std::string dir_;
  ChildExitWaiter reaper_;
  WorkerPool pool_{&reaper_};
  WorkerSpawn spawn_;
  const std::string key_ = WorkerPool::JobKey("job1", "cmd:x");
};

TEST_F(WarmPoolTest, StartsTheWarmCountOnceAndAgainOnlyAfterAnActorTookOneAndTheDelayPassed) {
  pool_.SetWarm(key_, spawn_, 3);
  ASSERT_TRUE(pool_.Refill().ok());
  EXPECT_EQ(pool_.Starting(key_), 3);
  ASSERT_TRUE(pool_.Refill().ok());  // three are starting: none more
  EXPECT_EQ(pool_.workers().size(), 3u);
  EXPECT_EQ(RegisterAll(), 3);
  EXPECT_EQ(Count(WorkerState::kIdle), 3);

  // An actor takes one: no new interpreter starts beside the burst, then one does.
  Worker* w = pool_.FindIdle(key_);
  ASSERT_NE(w, nullptr);
  w->state = WorkerState::kActor;
  pool_.WarmTaken();
  ASSERT_TRUE(pool_.Refill().ok());
  EXPECT_EQ(pool_.workers().size(), 3u);
  std::this_thread::sleep_for(WorkerPool::kWarmRefillDelay + std::chrono::milliseconds(50));
  ASSERT_TRUE(pool_.Refill().ok());
  EXPECT_EQ(pool_.workers().size(), 4u);
  EXPECT_EQ(pool_.Starting(key_), 1);

  // A task's lease comes back: a leased worker still counts, so none is started for it.
  EXPECT_EQ(RegisterAll(), 1);
  Worker* leased = pool_.FindIdle(key_);
  ASSERT_NE(leased, nullptr);
  leased->state = WorkerState::kLeased;
  ASSERT_TRUE(pool_.Refill().ok());
  EXPECT_EQ(pool_.workers().size(), 4u);
}

TEST_F(WarmPoolTest, AnActorClaimsAWarmWorkerStillStartingAndLeasesStopCountingOnIt) {
  pool_.SetWarm(key_, spawn_, 2);
  ASSERT_TRUE(pool_.Refill().ok());
  ASSERT_EQ(pool_.Starting(key_), 2);
  // A key without warm workers is never claimed from.
  EXPECT_EQ(pool_.ClaimStarting(WorkerPool::JobKey("job2", "cmd:x"), "actor0"), nullptr);
  Worker* w = pool_.ClaimStarting(key_, "actor1");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->reserved_for, "actor1");
  EXPECT_EQ(pool_.Starting(key_), 1);
  // Once registered it idles for its actor only: FindIdle (task leases) skips it.
  std::string claimed = w->id;
  EXPECT_TRUE(pool_.Registered(claimed, "127.0.0.1:1"));
  EXPECT_EQ(pool_.Starting(key_), 1);
  EXPECT_EQ(pool_.FindIdle(key_), nullptr);  // the other one is still starting
  EXPECT_NE(pool_.ClaimStarting(key_, "actor2"), nullptr);
  EXPECT_EQ(pool_.ClaimStarting(key_, "actor3"), nullptr);  // none left starting
}

TEST_F(WarmPoolTest, WarmWorkersAreNeverStoppedForIdlingButGoWithTheirJob) {
  pool_.SetWarm(key_, spawn_, 2);
  ASSERT_TRUE(pool_.Refill().ok());
  // One more idle worker of the key, beyond the warm count.
  WorkerSpawn extra = spawn_;
  ASSERT_TRUE(pool_.Start(key_, extra).ok());
  ASSERT_EQ(RegisterAll(), 3);
  // Keep none idle, however briefly: only the one beyond the warm count is stopped.
  auto stopped = pool_.PickIdleToStop(0, std::chrono::milliseconds(0));
  EXPECT_EQ(stopped.size(), 1u);
  EXPECT_TRUE(pool_.PickIdleToStop(0, std::chrono::milliseconds(0)).empty());
  // The job ends: its warm workers are stopped and never started again.
  pool_.JobFinished("job1");
  EXPECT_EQ(pool_.PickIdleToStop(0, std::chrono::milliseconds(0)).size(), 2u);
  ASSERT_TRUE(pool_.Refill().ok());
  EXPECT_EQ(pool_.Starting(key_), 0);
  pool_.SetWarm(key_, spawn_, 2);  // a late registration of the finished job starts nothing
  ASSERT_TRUE(pool_.Refill().ok());
  EXPECT_EQ(pool_.Starting(key_), 0);
}

TEST_F(WarmPoolTest, TheWarmCountIsCapped) {
  pool_.SetWarm(key_, spawn_, 1000);
  ASSERT_TRUE(pool_.Refill().ok());
  EXPECT_EQ(pool_.Starting(key_), WorkerPool::kMaxWarmWorkers);
}

TEST_F(WarmPoolTest, AKeyWhoseWarmWorkersKeepDyingBeforeRegisteringIsNoLongerWarmed) {
  spawn_.command = {"/bin/false"};  // exits at once, never registers
  pool_.SetWarm(key_, spawn_, 1);
  for (int round = 0; round < 5; ++round) {
    ASSERT_TRUE(pool_.Refill().ok());
    for (pid_t p : pool_.Pids()) {
      waitpid(p, nullptr, 0);
      pool_.TakeExited(p);
    }
  }
  // Three deaths, then nothing is started: the last two rounds found no warm key.
  ASSERT_TRUE(pool_.Refill().ok());
  EXPECT_EQ(pool_.Starting(key_), 0);
  EXPECT_TRUE(pool_.workers().empty());
}

}  // namespace
}  // namespace torus
