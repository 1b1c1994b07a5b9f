#include "launcher/host_budget.h"

#include <gtest/gtest.h>

namespace torus::launcher {
namespace {

constexpr uint64_t kGiB = 1ull << 30;

TEST(HostBudgetTest, TheDefaultIsWhatMemoryAndTasksBothHaveRoomFor) {
  auto by_memory = ResolveHostLimit(std::nullopt, std::nullopt, {16 * kGiB, 1000000});
  ASSERT_TRUE(by_memory.ok());
  EXPECT_EQ(by_memory->max_hosts, static_cast<int64_t>(16 * kGiB / kHostMemoryBytes));
  EXPECT_NE(by_memory->source.find("16.0 GiB of memory available"), std::string::npos) << by_memory->source;
  auto by_tasks = ResolveHostLimit(std::nullopt, std::nullopt, {1024 * kGiB, 25 * kHostTasks + 7});
  ASSERT_TRUE(by_tasks.ok());
  EXPECT_EQ(by_tasks->max_hosts, 25);
  // A machine without room still runs the head's own host (and says why when asked for more).
  auto none = ResolveHostLimit(std::nullopt, std::nullopt, {0, 0});
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->max_hosts, 1);
}

TEST(HostBudgetTest, TheFlagWinsOverTheVariableWhichWinsOverTheDefault) {
  MachineRoom tiny{kHostMemoryBytes, kHostTasks};
  auto flag = ResolveHostLimit(std::string("20000"), std::string("5"), tiny);
  ASSERT_TRUE(flag.ok());
  EXPECT_EQ(flag->max_hosts, 20000);
  EXPECT_EQ(flag->source, "--max-hosts 20000");
  auto env = ResolveHostLimit(std::nullopt, std::string("5"), tiny);
  ASSERT_TRUE(env.ok());
  EXPECT_EQ(env->max_hosts, 5);
  EXPECT_EQ(env->source, "TORUS_MAX_HOSTS=5");
  for (const char* bad : {"0", "-3", "ten", "", "12x", "99999999999999999999"}) {
    auto r = ResolveHostLimit(std::string(bad), std::nullopt, tiny);
    ASSERT_FALSE(r.ok()) << bad;
    const std::string want = "--max-hosts must be a positive number of hosts, got '" + std::string(bad) + "'";
    EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
  }
  EXPECT_FALSE(ResolveHostLimit(std::nullopt, std::string("0"), tiny).ok());
}

// Issue 41 #7: a manifest asking for 10,000 hosts forked node processes until fork failed.
TEST(HostBudgetTest, APlanLargerThanTheLimitIsRefusedSayingHowToAllowMore) {
  auto limit = ResolveHostLimit(std::nullopt, std::nullopt, {8 * kGiB, 1000000});
  ASSERT_TRUE(limit.ok());
  EXPECT_TRUE(CheckHostCount(static_cast<size_t>(limit->max_hosts), *limit).ok());
  Status s = CheckHostCount(10001, *limit);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  const std::string& m = s.message();
  EXPECT_NE(m.find("the manifest asks for 10001 hosts"), std::string::npos) << m;
  EXPECT_NE(m.find("more than the " + std::to_string(limit->max_hosts) + " allowed by what this machine has room for"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("nothing was started"), std::string::npos) << m;
  EXPECT_NE(m.find("--max-hosts N (or TORUS_MAX_HOSTS=N)"), std::string::npos) << m;
}

TEST(HostBudgetTest, ThisMachineHasRoomForSomeHosts) {
  MachineRoom room = ReadMachineRoom();
  EXPECT_GT(room.memory_bytes, 0u);
  EXPECT_GT(room.tasks, 0u);
}

}  // namespace
}  // namespace torus::launcher
