#include "common/one_shot_thread.h"

#include <gtest/gtest.h>

#include <atomic>

namespace torus {
namespace {

TEST(OneShotThreadTest, RunsTheFirstClosureOnceOnAnotherThread) {
  std::atomic<int> ran{0};
  std::thread::id ran_on;
  OneShotThread t;
  EXPECT_TRUE(t.Run([&] {
    ran_on = std::this_thread::get_id();
    ++ran;
  }));
  EXPECT_FALSE(t.Run([&] { ran += 10; }));
  t.Join();
  EXPECT_EQ(ran.load(), 1);
  EXPECT_NE(ran_on, std::this_thread::get_id());
  EXPECT_FALSE(t.Run([&] { ran += 10; }));  // once only, also after it ended
  t.Join();
  EXPECT_EQ(ran.load(), 1);
}

TEST(OneShotThreadTest, DestructorJoinsTheClosure) {
  std::atomic<bool> done{false};
  {
    OneShotThread t;
    t.Run([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done = true;
    });
  }
  EXPECT_TRUE(done.load());
}

}  // namespace
}  // namespace torus
