// Test fixtures that share one real cluster per test suite (see cluster.h), and helpers common to
// the multi-process tests.
//
//   struct MySuite : ClusterTest<MySuite> {
//     static constexpr const char* kName = "mysuite";
//     static void Build(TestCluster& c) { c.StartHead(2); }
//   };
//   TEST_F(MySuite, Something) { ... cluster() ... }
//
// SetUpTestSuite builds the cluster and connects this process as its driver; TearDownTestSuite
// stops it and fails the suite if any process or shared-memory segment of the cluster was left
// behind. ctest runs every test in its own process (gtest_discover_tests), so there the "suite"
// is one test; running the binary directly shares one cluster among a suite's tests.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdlib>
#include <memory>
#include <ray/api.h>
#include <set>
#include <stdexcept>
#include <string>

#include "cluster.h"

namespace torus_test {

// Upper bound for any Get in these tests: a hang becomes a failure, not a ctest timeout.
inline constexpr int kGetTimeoutMs = 60000;

template <typename Derived>
class ClusterTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    SetupError().clear();
    try {
      Cluster() = std::make_unique<TestCluster>(Derived::kName);
      Derived::Build(*Cluster());
      if (Derived::kConnectDriver) Cluster()->ConnectDriver();
    } catch (const std::exception& e) {
      SetupError() = e.what();
    }
  }
  static void TearDownTestSuite() {
    if (!Cluster()) return;
    for (const auto& leftover : Cluster()->Stop()) ADD_FAILURE() << leftover;
    Cluster().reset();
  }

 protected:
  static constexpr bool kConnectDriver = true;

  void SetUp() override {
    ASSERT_TRUE(SetupError().empty()) << "cluster setup failed: " << SetupError();
  }
  static TestCluster& cluster() { return *Cluster(); }

 private:
  static std::unique_ptr<TestCluster>& Cluster() {
    static std::unique_ptr<TestCluster> c;
    return c;
  }
  static std::string& SetupError() {
    static std::string e;
    return e;
  }
};

// The standard three-node shape: the head's node and two more, each with a resource naming it
// so a task can be pinned there (SetResource("node_a", 1)). Node A's environment carries
// TPU_NAME=test-slice; node B alone has {"custom": 1}.
struct ThreeNodes {
  NodeInfo head, a, b;
  void Build(TestCluster& c) {
    unsetenv("TPU_NAME");
    c.StartHead(2, {{"head_res", 100}}, {{"zone", "head"}});
    head = c.head_node();
    NodeSpec sa;
    sa.num_cpus = 2;
    sa.resources = {{"node_a", 100}};
    sa.labels = {{"zone", "a"}};
    sa.env = {{"TPU_NAME", "test-slice"}};
    a = c.AddNode(sa);
    NodeSpec sb;
    sb.num_cpus = 2;
    sb.resources = {{"node_b", 100}, {"custom", 1}};
    sb.labels = {{"zone", "b"}};
    b = c.AddNode(sb);
  }
};

// Ids of the nodes `torus list nodes` reports alive.
inline std::set<std::string> AliveNodeIds(const TestCluster& c) {
  std::set<std::string> ids;
  for (const auto& n : c.ListJson("nodes")) {
    if (n.value("state", "") == "ALIVE") ids.insert(n.value("node_id", ""));
  }
  return ids;
}

// The `torus list workers` entry of the worker hosting `actor_id`, or null.
inline nlohmann::json WorkerOfActor(const TestCluster& c, const std::string& actor_id) {
  for (const auto& w : c.ListJson("workers")) {
    if (w.value("actor_id", "") == actor_id) return w;
  }
  return nullptr;
}

// The `torus list actors` entry of `actor_id`, or null.
inline nlohmann::json ActorEntry(const TestCluster& c, const std::string& actor_id) {
  for (const auto& a : c.ListJson("actors")) {
    if (a.value("actor_id", "") == actor_id) return a;
  }
  return nullptr;
}

// A fresh empty directory under the cluster's tmpdir, for tasks to leave files in.
inline std::string ScratchDir(const TestCluster& c, const std::string& name) {
  static int counter = 0;
  std::string dir = c.tmpdir() + "/scratch-" + name + "-" + std::to_string(counter++);
  if (mkdir(dir.c_str(), 0755) != 0) throw std::runtime_error("mkdir " + dir);
  return dir;
}

}  // namespace torus_test
