// Resources: custom resources steer work to the nodes that have them, work waits for free
// resources, and work no node could ever run stays pending and is reported.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ray/api.h>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cluster_fixture.h"

std::string ResNodeId() {
  const char* v = std::getenv("TORUS_NODE_ID");
  return v ? v : "";
}

// [start, end] in steady-clock microseconds (one machine: comparable across processes).
std::pair<int64_t, int64_t> ResSpan(int sleep_ms) {
  auto now = [] {
    return std::chrono::duration_cast<std::chrono::microseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  };
  int64_t start = now();
  std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  return {start, now()};
}

class ResHolder {
 public:
  static ResHolder* Create() { return new ResHolder(); }
  std::string Where() { return ResNodeId(); }
};

RAY_REMOTE(ResNodeId, ResSpan, ResHolder::Create, &ResHolder::Where);

namespace torus_test {
namespace {

struct ResourceTest : ClusterTest<ResourceTest> {
  static constexpr const char* kName = "resource";
  static inline ThreeNodes shape;
  static void Build(TestCluster& c) { shape.Build(c); }
};

// The "Pending demands" section of `torus status`.
std::string PendingSection(const std::string& status) {
  auto at = status.find("Pending demands");
  return at == std::string::npos ? std::string() : status.substr(at);
}

TEST_F(ResourceTest, CustomResourceRunsOnTheNodeThatHasIt) {
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(*ray::Task(ResNodeId).SetResource("custom", 1).Remote().Get(kGetTimeoutMs),
              shape.b.node_id);
  }
  EXPECT_EQ(*ray::Task(ResNodeId)
                 .SetResources({{"CPU", 1}, {"custom", 0.5}})
                 .Remote()
                 .Get(kGetTimeoutMs),
            shape.b.node_id);
}

TEST_F(ResourceTest, ActorHoldingAResourceShowsInStatus) {
  auto holder = ray::Actor(ResHolder::Create).SetResource("custom", 1).Remote();
  EXPECT_EQ(*holder.Task(&ResHolder::Where).Remote().Get(kGetTimeoutMs), shape.b.node_id);
  // The only unit of "custom" is in use: `torus status` says 1 / 1.
  std::string status;
  EXPECT_TRUE(WaitUntil([&] {
    status = cluster().Status();
    auto section = status.find("Resources (used / total)");
    if (section == std::string::npos) return false;
    auto at = status.find("custom", section);
    if (at == std::string::npos) return false;
    std::string line = status.substr(at, status.find('\n', at) - at);
    return line.find("1 / 1") != std::string::npos;
  })) << status;
  holder.Kill();
}

TEST_F(ResourceTest, InfeasibleRequestStaysPendingAndIsReported) {
  ray::ObjectRef<std::string> never = ray::Task(ResNodeId).SetResource("no_such_res", 1).Remote();
  std::vector<ray::ObjectRef<std::string>> refs = {never};
  ray::WaitResult<std::string> w = ray::Wait(refs, 1, 1500);
  EXPECT_TRUE(w.ready.empty());
  EXPECT_EQ(w.unready.size(), 1u);

  // Feasible work still runs meanwhile.
  EXPECT_FALSE(ray::Task(ResNodeId).Remote().Get(kGetTimeoutMs)->empty());

  std::string status;
  EXPECT_TRUE(WaitUntil([&] {
    std::string pending = PendingSection(status = cluster().Status());
    return pending.find("no_such_res") != std::string::npos &&
           pending.find("infeasible") != std::string::npos;
  })) << "torus status does not report the infeasible demand:\n"
      << status;

  // ... and the logs say so.
  EXPECT_TRUE(WaitUntil([&] {
    RunResult r = RunProcess({"/bin/sh", "-c",
                              "grep -l infeasible '" + cluster().session_dir() + "'/logs/* "
                              "| head -1"});
    return !r.out.empty();
  })) << "no log in " << cluster().session_dir() << "/logs mentions the infeasible request";

  // Still pending a while later.
  EXPECT_TRUE(ray::Wait(refs, 1, 500).ready.empty());
}

TEST_F(ResourceTest, MoreCpusThanAnyNodeHasIsInfeasible) {
  auto never = ray::Task(ResNodeId).SetResource("CPU", 64).Remote();
  EXPECT_TRUE(ray::Wait(std::vector<ray::ObjectRef<std::string>>{never}, 1, 1000).ready.empty());
  std::string status;
  EXPECT_TRUE(WaitUntil([&] {
    std::string pending = PendingSection(status = cluster().Status());
    return pending.find("CPU: 64") != std::string::npos &&
           pending.find("infeasible") != std::string::npos;
  })) << status;
}

TEST_F(ResourceTest, InfeasibleActorIsReported) {
  auto never = ray::Actor(ResHolder::Create).SetResource("no_such_actor_res", 1).Remote();
  auto call = never.Task(&ResHolder::Where).Remote();
  EXPECT_TRUE(ray::Wait(std::vector<ray::ObjectRef<std::string>>{call}, 1, 1000).ready.empty());
  std::string status;
  EXPECT_TRUE(WaitUntil([&] {
    std::string pending = PendingSection(status = cluster().Status());
    return pending.find("ResHolder") != std::string::npos;
  })) << status;
}

TEST_F(ResourceTest, MemoryResourceCanBeRequested) {
  // Ray's nodes advertise "memory"; a task asking for some runs.
  auto ref = ray::Task(ResNodeId).SetResource("memory", 64.0 * 1024 * 1024).Remote();
  EXPECT_FALSE(ref.Get(20000)->empty());
}

// One CPU: tasks that each need it run one after the other; tasks needing half of it share it.
struct OneCpuResourceTest : ClusterTest<OneCpuResourceTest> {
  static constexpr const char* kName = "onecpu";
  static void Build(TestCluster& c) { c.StartHead(1); }
};

TEST_F(OneCpuResourceTest, TasksWaitForAFreeCpu) {
  std::vector<ray::ObjectRef<std::pair<int64_t, int64_t>>> refs;
  for (int i = 0; i < 3; ++i) refs.push_back(ray::Task(ResSpan).Remote(300));
  auto spans = ray::Get(refs, kGetTimeoutMs);
  std::vector<std::pair<int64_t, int64_t>> sorted;
  for (auto& s : spans) sorted.push_back(*s);
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) {
    EXPECT_LE(sorted[i - 1].second, sorted[i].first) << "two 1-CPU tasks ran at once on 1 CPU";
  }
}

TEST_F(OneCpuResourceTest, FractionalCpuTasksShareIt) {
  std::vector<ray::ObjectRef<std::pair<int64_t, int64_t>>> refs;
  for (int i = 0; i < 2; ++i) refs.push_back(ray::Task(ResSpan).SetResource("CPU", 0.5).Remote(1500));
  auto spans = ray::Get(refs, kGetTimeoutMs);
  EXPECT_LT(std::max(spans[0]->first, spans[1]->first),
            std::min(spans[0]->second, spans[1]->second))
      << "two 0.5-CPU tasks did not run at the same time on 1 CPU";
}

}  // namespace
}  // namespace torus_test
