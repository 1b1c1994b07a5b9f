// Lost objects (docs/objects.md "Lost objects"): a task result whose only copy was in the store
// of a node that died is made again by running its task again (lineage reconstruction), its lost
// or evicted arguments first; a result that cannot be made again fails Get with a clear
// object-lost error. Real processes: the node daemon holding the value is SIGKILLed.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <ray/api.h>
#include <string>

#include "cluster_fixture.h"

namespace {

// Claims the next attempt number in `dir` (attempt-0, attempt-1, ...) and records the node that
// runs it in node-<n>. Returns n.
int LineageRecord(const std::string& dir) {
  const char* node = std::getenv("TORUS_NODE_ID");
  for (int n = 0;; ++n) {
    std::string claim = dir + "/attempt-" + std::to_string(n);
    int fd = open(claim.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) continue;
    close(fd);
    {
      std::ofstream out(dir + "/.node-" + std::to_string(n));
      out << (node ? node : "");
    }
    rename((dir + "/.node-" + std::to_string(n)).c_str(), (dir + "/node-" + std::to_string(n)).c_str());
    return n;
  }
}

// A value too large to travel inline (it lives in the store of the node that made it), ending in
// `tag`.
std::string LineageMake(std::string dir, std::string tag) {
  LineageRecord(dir);
  return std::string(512 * 1024, 'v') + tag;
}

// Appends `tag` to a large argument (so it reads that argument from the store).
std::string LineageExtend(std::string dir, std::string in, std::string tag) {
  LineageRecord(dir);
  return in + tag;
}

// A borrower: reads the object inside its argument and returns its last character and size.
std::string LineageReadNested(std::vector<ray::ObjectRef<std::string>> refs) {
  auto v = refs.at(0).Get();
  return std::string(1, v->back()) + ":" + std::to_string(v->size());
}

}  // namespace

RAY_REMOTE(LineageMake, LineageExtend, LineageReadNested);

namespace torus_test {
namespace {

int Attempts(const std::string& dir) {
  int n = 0;
  while (access((dir + "/attempt-" + std::to_string(n)).c_str(), F_OK) == 0) ++n;
  return n;
}

std::string NodeOfAttempt(const std::string& dir, int n) {
  std::ifstream in(dir + "/node-" + std::to_string(n));
  std::string s;
  std::getline(in, s);
  return s;
}

std::string Tail(const std::string& s, size_t n) { return s.size() <= n ? s : s.substr(s.size() - n); }

// The head's node (the driver's, never killed) and nodes with {"spare": 1} for the work; each test
// adds one spare node, so two are alive when it kills one. Dead nodes are declared after 2 s.
struct LineageTest : ClusterTest<LineageTest> {
  static constexpr const char* kName = "lineage";
  static constexpr bool kConnectDriver = false;
  static void Build(TestCluster& c) {
    c.StartHead(1, nlohmann::json::object(), {}, {"--node-timeout-ms", "2000"});
    c.ConnectDriver();
    AddSpare(c);
  }
  static NodeInfo AddSpare(TestCluster& c) {
    NodeSpec s;
    s.num_cpus = 1;
    s.resources = {{"spare", 1}};
    return c.AddNode(s);
  }
  void SetUp() override {
    ClusterTest::SetUp();
    AddSpare(cluster());
  }
  void Kill(const std::string& node_id) {
    for (const auto& n : cluster().nodes()) {
      if (n.node_id == node_id) {
        cluster().KillNode(n);
        return;
      }
    }
    FAIL() << "no node " << node_id;
  }
};

TEST_F(LineageTest, AResultLostWithItsNodeIsMadeAgainByItsTask) {
  std::string dir = ScratchDir(cluster(), "rebuild");
  auto x = ray::Task(LineageMake).SetResource("spare", 1).Remote(dir, "x");
  // Ready, not read: the driver holds no copy of its own.
  ASSERT_EQ(ray::Wait(std::vector<ray::ObjectRef<std::string>>{x}, 1, kGetTimeoutMs).ready.size(), 1u);
  const std::string made_on = NodeOfAttempt(dir, 0);
  Kill(made_on);
  auto v = x.Get(kGetTimeoutMs);
  ASSERT_EQ(v->size(), 512 * 1024 + 1);
  EXPECT_EQ(v->back(), 'x');
  EXPECT_EQ(Attempts(dir), 2);
  EXPECT_NE(NodeOfAttempt(dir, 1), made_on);
}

TEST_F(LineageTest, ARebuildMakesItsEvictedArgumentAgainFirst) {
  std::string dx = ScratchDir(cluster(), "chain-x"), dy = ScratchDir(cluster(), "chain-y");
  ray::ObjectRef<std::string> y;
  {
    auto x = ray::Task(LineageMake).SetResource("spare", 1).Remote(dx, "x");
    y = ray::Task(LineageExtend).SetResource("spare", 1).Remote(dy, x, "y");
    ASSERT_EQ(ray::Wait(std::vector<ray::ObjectRef<std::string>>{y}, 1, kGetTimeoutMs).ready.size(), 1u);
  }  // x is dropped: its value goes, what makes it stays (y's task needs it)
  Kill(NodeOfAttempt(dy, 0));
  auto v = y.Get(kGetTimeoutMs);
  EXPECT_EQ(Tail(*v, 2), "xy");
  EXPECT_EQ(v->size(), 512 * 1024 + 2);
  EXPECT_EQ(Attempts(dx), 2) << "x was not made again";
  EXPECT_EQ(Attempts(dy), 2);
}

TEST_F(LineageTest, ATaskWhoseArgumentWasLostRunsAgainOnceItIsMadeAgain) {
  std::string dx = ScratchDir(cluster(), "arg-x"), dy = ScratchDir(cluster(), "arg-y");
  auto x = ray::Task(LineageMake).SetResource("spare", 1).Remote(dx, "x");
  ASSERT_EQ(ray::Wait(std::vector<ray::ObjectRef<std::string>>{x}, 1, kGetTimeoutMs).ready.size(), 1u);
  Kill(NodeOfAttempt(dx, 0));
  // Submitted after the loss: its executor cannot read x, x is made again, then y runs again.
  auto y = ray::Task(LineageExtend).Remote(dy, x, "y");
  auto v = y.Get(kGetTimeoutMs);
  EXPECT_EQ(Tail(*v, 2), "xy");
  EXPECT_EQ(Attempts(dx), 2);
  EXPECT_GE(Attempts(dy), 1);
}

TEST_F(LineageTest, ABorrowerThatCannotReadAValueHasItsOwnerMakeItAgain) {
  std::string dir = ScratchDir(cluster(), "borrower");
  auto x = ray::Task(LineageMake).SetResource("spare", 1).Remote(dir, "x");
  ASSERT_EQ(ray::Wait(std::vector<ray::ObjectRef<std::string>>{x}, 1, kGetTimeoutMs).ready.size(), 1u);
  Kill(NodeOfAttempt(dir, 0));
  // The task borrows x (inside its argument), fails to read it, and asks the driver, its owner.
  auto r = ray::Task(LineageReadNested).Remote(std::vector<ray::ObjectRef<std::string>>{x});
  EXPECT_EQ(*r.Get(kGetTimeoutMs), "x:" + std::to_string(512 * 1024 + 1));
  EXPECT_EQ(Attempts(dir), 2);
}

TEST_F(LineageTest, AResultThatCannotBeMadeAgainFailsNamingTheObjectAndWhy) {
  std::string dir = ScratchDir(cluster(), "norebuild");
  auto x = ray::Task(LineageMake).SetResource("spare", 1).SetMaxRetries(0).Remote(dir, "x");
  ASSERT_EQ(ray::Wait(std::vector<ray::ObjectRef<std::string>>{x}, 1, kGetTimeoutMs).ready.size(), 1u);
  Kill(NodeOfAttempt(dir, 0));
  try {
    x.Get(kGetTimeoutMs);
    FAIL() << "Get of a lost object that cannot be rebuilt returned";
  } catch (const ray::internal::UnreconstructableException& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(x.ID()), std::string::npos) << msg;
    EXPECT_NE(msg.find("is lost"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cannot be rebuilt"), std::string::npos) << msg;
  }
  EXPECT_EQ(Attempts(dir), 1);
}

}  // namespace
}  // namespace torus_test
