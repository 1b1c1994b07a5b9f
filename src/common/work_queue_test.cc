#include "common/work_queue.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <vector>
#include <thread>
#include <condition_variable>

namespace torus {
namespace {

TEST(WorkQueueTest, StopRunsEverythingQueued) {
  std::atomic<int> ran{0};
  WorkQueue q(2, 1000);
  for (int i = 0; i < 200; ++i) EXPECT_TRUE(q.Post([&] { ran++; }));
  q.Stop();
  EXPECT_EQ(ran.load(), 200);
  EXPECT_FALSE(q.Post([&] { ran++; }));
  EXPECT_EQ(ran.load(), 200);
}

TEST(WorkQueueTest, OneThreadRunsInOrder) {
  std::vector<int> order;
  std::mutex mu;
  {
    WorkQueue q(1, 1000);
    for (int i = 0; i < 50; ++i) {
      q.Post([&, i] {
        std::lock_guard<std::mutex> l(mu);
        order.push_back(i);
      });
    }
  }  // the destructor stops and joins
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkQueueTest, FullQueueMakesThePosterWait) {
  WorkQueue q(1, 1);
  std::mutex gate;
  gate.lock();
  std::atomic<int> ran{0};
  q.Post([&] {  // taken by the thread, blocks it
    std::lock_guard<std::mutex> l(gate);
    ran++;
  });
  // Returns once the thread has taken the first closure; this one then fills the queue.
  EXPECT_TRUE(q.Post([&] { ran++; }));
  std::atomic<bool> third_posted{false};
  std::thread poster([&] {
    q.Post([&] { ran++; });
    third_posted = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  bool posted_early = third_posted.load();  // the queue is full: the poster must still wait
  gate.unlock();
  poster.join();
  q.Stop();
  EXPECT_EQ(ran.load(), 3);
  EXPECT_FALSE(posted_early);
}

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

TEST(WorkQueueTest, StopDrainsEveryQueuedJobOnAtMostMaxThreads) {
  Gate gate;
  std::atomic<int> done{0};
  WorkQueue pool(3, 0);  // unbounded: Post never waits
  for (int i = 0; i < 20; ++i) {
    ASSERT_TRUE(pool.Post([&] {
      gate.Wait();
      ++done;
    }));
  }
  EXPECT_EQ(pool.threads(), 3u);  // the rest waits in the queue
  gate.Open();
  pool.Stop();
  EXPECT_EQ(done.load(), 20);
  EXPECT_FALSE(pool.Post([&] { ++done; }));
  EXPECT_EQ(done.load(), 20);
}

TEST(WorkQueueTest, SubmitNeverRunsTheJobOnTheCallersThread) {
  WorkQueue pool(1, 0);
  std::thread::id ran_on;
  ASSERT_TRUE(pool.Post([&] { ran_on = std::this_thread::get_id(); }));
  pool.Stop();
  EXPECT_NE(ran_on, std::thread::id());
  EXPECT_NE(ran_on, std::this_thread::get_id());
}

// Polls until the pool has `n` threads or 10 s went by; the pool's count.
size_t WaitForThreads(const WorkQueue& pool, size_t n) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (pool.threads() != n && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pool.threads();
}

TEST(WorkQueueTest, IdleThreadsRetireAfterABurstAndWorkStillRunsAfterwards) {
  WorkQueue pool(8, 0, std::chrono::milliseconds(20));
  Gate gate;
  std::atomic<int> done{0};
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(pool.Post([&] {
      gate.Wait();
      ++done;
    }));
  }
  EXPECT_EQ(pool.threads(), 8u);  // a burst: one thread per blocked closure
  gate.Open();
  EXPECT_EQ(WaitForThreads(pool, 0), 0u);  // all idle, all retired
  EXPECT_EQ(done.load(), 8);
  // Work posted after the retirement runs on a new thread.
  std::atomic<bool> ran{false};
  ASSERT_TRUE(pool.Post([&] { ran = true; }));
  EXPECT_EQ(pool.threads(), 1u);
  pool.Stop();
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(pool.threads(), 0u);
}

TEST(WorkQueueTest, ABusyThreadDoesNotRetire) {
  WorkQueue pool(1, 0, std::chrono::milliseconds(2000));
  std::atomic<int> done{0};
  // Closures arriving faster than the idle timeout keep the one thread.
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(pool.Post([&] { ++done; }));
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_EQ(pool.threads(), 1u);
  }
  pool.Stop();
  EXPECT_EQ(done.load(), 10);
}

}  // namespace
}  // namespace torus
