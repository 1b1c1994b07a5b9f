// Leases under many concurrent drivers: bursts of drivers, each submitting short tasks and
// exiting (often while lease requests are still queued at a node), must all finish, and every
// CPU of every node must come back afterwards: no lease stays held by a driver that is gone or
// that never received its grant, and no request waits at a busy node while another is idle.
//
// A leak shows in a fraction of bursts, so each test runs several bursts with different driver
// counts, task lengths and node sizes, and checks the ledger after each one.
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ray/api.h>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"

int LeaseSleepMs(int ms) {
  if (ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  return ms;
}
RAY_REMOTE(LeaseSleepMs);

// A driver of a burst: BURST_TASKS tasks of BURST_MS each (3 retries), all fetched, then exit.
TORUS_TEST_CHILD_SCENARIO(lease_burst_driver) {
  int n = std::atoi(std::getenv("BURST_TASKS"));
  int ms = std::atoi(std::getenv("BURST_MS"));
  try {
    ray::Init();
    std::vector<ray::ObjectRef<int>> refs;
    for (int i = 0; i < n; ++i) refs.push_back(ray::Task(LeaseSleepMs).SetMaxRetries(3).Remote(ms));
    for (auto& r : refs) {
      if (*r.Get(120000) != ms) {
        std::printf("wrong result\n");
        return 3;
      }
    }
    ray::Shutdown();
  } catch (const std::exception& e) {
    std::printf("driver failed: %s\n", e.what());
    return 4;
  }
  return 0;
}

namespace torus_test {
namespace {

struct Burst {
  int drivers;
  int tasks;
  int ms;
};

// Total and available CPU summed over the live nodes, from `torus list nodes` (the nodes' own
// ledgers), plus the number of workers still leased.
struct CpuState {
  double total = 0;
  double available = 0;
  int leased_workers = 0;
  std::string Describe() const {
    return "CPU " + std::to_string(available) + " / " + std::to_string(total) + " available, " +
           std::to_string(leased_workers) + " workers leased";
  }
};

CpuState ReadCpu(TestCluster& c) {
  CpuState s;
  for (const auto& n : c.ListJson("nodes")) {
    if (n.value("state", "") != "ALIVE") continue;
    s.total += n["resources_total"].value("CPU", 0.0);
    s.available += n["resources_available"].value("CPU", 0.0);
  }
  for (const auto& w : c.ListJson("workers")) {
    if (w.value("state", "") == "LEASED" || w.value("state", "") == "leased") s.leased_workers++;
  }
  return s;
}

// Runs the bursts one after the other; after each, every driver must have exited 0 and every
// CPU must be back within `settle`.
void RunBursts(TestCluster& c, const std::vector<Burst>& bursts, std::chrono::seconds settle) {
  for (size_t b = 0; b < bursts.size(); ++b) {
    const Burst& burst = bursts[b];
    std::vector<RunResult> results(burst.drivers);
    std::vector<std::thread> threads;
    for (int i = 0; i < burst.drivers; ++i) {
      threads.emplace_back([&, i] {
        results[i] = RunChild("lease_burst_driver",
                              {{"TORUS_ADDRESS", c.address()},
                               {"BURST_TASKS", std::to_string(burst.tasks)},
                               {"BURST_MS", std::to_string(burst.ms)}},
                              {}, 150);
      });
    }
    for (auto& t : threads) t.join();
    std::string what = "burst " + std::to_string(b) + " (" + std::to_string(burst.drivers) +
                       " drivers x " + std::to_string(burst.tasks) + " tasks of " +
                       std::to_string(burst.ms) + " ms)";
    int failed = 0;
    for (int i = 0; i < burst.drivers; ++i) {
      if (results[i].exit_code != 0) {
        ++failed;
        ADD_FAILURE() << what << ": driver " << i << ": " << results[i].Describe();
      }
    }
    ASSERT_EQ(failed, 0) << what;
    CpuState last;
    bool back = WaitUntil(
        [&] {
          last = ReadCpu(c);
          return last.total > 0 && last.available == last.total && last.leased_workers == 0;
        },
        settle);
    ASSERT_TRUE(back) << what << ": capacity did not come back: " << last.Describe() << "\n"
                      << c.Status();
  }
}

// The reported case: a head node and one more node of 2 CPUs each.
struct LeaseBurstTest : ClusterTest<LeaseBurstTest> {
  static constexpr const char* kName = "leaseburst";
  static constexpr bool kConnectDriver = false;
  static void Build(TestCluster& c) {
    c.StartHead(2);
    NodeSpec s;
    s.num_cpus = 2;
    c.AddNode(s);
  }
};

TEST_F(LeaseBurstTest, EveryCpuComesBackAfterBurstsOfDrivers) {
  RunBursts(cluster(),
            {{20, 20, 100}, {20, 10, 0}, {12, 30, 20}, {20, 20, 100}, {30, 4, 50}, {20, 20, 5}},
            std::chrono::seconds(20));
}

// Uneven nodes: 1, 3 and 1 CPUs, drivers all attached to the 1-CPU head node, so most work
// must spill to the bigger node and queued requests must move when it frees up.
struct LeaseBurstUnevenTest : ClusterTest<LeaseBurstUnevenTest> {
  static constexpr const char* kName = "leaseuneven";
  static constexpr bool kConnectDriver = false;
  static void Build(TestCluster& c) {
    c.StartHead(1);
    NodeSpec big;
    big.num_cpus = 3;
    c.AddNode(big);
    NodeSpec small;
    small.num_cpus = 1;
    c.AddNode(small);
  }
};

TEST_F(LeaseBurstUnevenTest, EveryCpuComesBackAndNoDriverWaitsBehindABusyNode) {
  RunBursts(cluster(), {{16, 15, 60}, {24, 6, 0}, {16, 15, 60}}, std::chrono::seconds(20));
}

}  // namespace
}  // namespace torus_test
