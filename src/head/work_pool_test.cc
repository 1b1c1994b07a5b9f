#include "head/work_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <condition_variable>
#include <thread>

namespace torus {
namespace {

// A gate the test opens: jobs block on it, so they pile up in the pool.
struct Gate {
  std::mutex mu;
  std::condition_variable cv;
  bool open = false;
  void Wait() {
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [this] { return open; });
  }
  void Open() {
    std::lock_guard<std::mutex> l(mu);
    open = true;
    cv.notify_all();
  }
};

TEST(WorkPoolTest, StopDrainsEveryQueuedJobOnAtMostMaxThreads) {
  Gate gate;
  std::atomic<int> done{0};
  WorkPool pool(3);
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(pool.Submit([&] {
      gate.Wait();
      ++done;
    }));
  }
  EXPECT_EQ(pool.threads(), 3u);  // the rest waits in the queue
  gate.Open();
  pool.Stop();
  EXPECT_EQ(done.load(), 20);
  EXPECT_FALSE(pool.Submit([&] { ++done; }));
  EXPECT_EQ(done.load(), 20);
}

TEST(WorkPoolTest, SubmitNeverRunsTheJobOnTheCallersThread) {
  WorkPool pool(1);
  std::thread::id ran_on;
  ASSERT_TRUE(pool.Submit([&] { ran_on = std::this_thread::get_id(); }));
  pool.Stop();
  EXPECT_NE(ran_on, std::thread::id());
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

}  // namespace
}  // namespace torus
