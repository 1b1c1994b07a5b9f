// Init and Shutdown: the embedded default (no address: a private cluster that Shutdown stops,
// leaving no process or shared memory), and joining a cluster by config, TORUS_ADDRESS,
// RAY_ADDRESS or --ray_address; namespaces; the API before Init and after Shutdown.
#include <dirent.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ray/api.h>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cluster_fixture.h"

std::string InitNodeId() {
  const char* v = std::getenv("TORUS_NODE_ID");
  return v ? v : "";
}
int InitPid() { return static_cast<int>(getpid()); }
int InitPlus(int a, int b) { return a + b; }

class InitActor {
 public:
  static InitActor* Create() { return new InitActor(); }
  int Pid() { return static_cast<int>(getpid()); }
};

RAY_REMOTE(InitNodeId, InitPid, InitPlus, InitActor::Create, &InitActor::Pid);

// A driver that reports what Init did. Optional: TEST_CONFIG_ADDRESS (RayConfig::address),
// TEST_ARGV_ADDRESS (--ray_address=... on a command line given to Init), TEST_NAMESPACE.
TORUS_TEST_CHILD_SCENARIO(init_report) {
  std::printf("before=%d\n", ray::IsInitialized() ? 1 : 0);
  try {
    ray::Put(1);
    std::printf("put_before_init=ok\n");
  } catch (const ray::internal::RayException&) {
    std::printf("put_before_init=threw\n");
  }
  ray::RayConfig cfg;
  if (const char* a = std::getenv("TEST_CONFIG_ADDRESS")) cfg.address = a;
  if (const char* ns = std::getenv("TEST_NAMESPACE")) cfg.ray_namespace = ns;
  try {
    if (const char* a = std::getenv("TEST_ARGV_ADDRESS")) {
      std::string prog = "driver", flag = std::string("--ray_address=") + a;
      char* argv[] = {prog.data(), flag.data(), nullptr};
      ray::Init(cfg, 2, argv);
    } else {
      ray::Init(cfg);
    }
  } catch (const std::exception& e) {
    std::printf("init failed: %s\n", e.what());
    return 4;
  }
  std::printf("initialized=%d\n", ray::IsInitialized() ? 1 : 0);
  std::printf("namespace=%s\n", ray::GetNamespace().c_str());
  std::printf("node=%s\n", ray::Task(InitNodeId).Remote().Get(30000)->c_str());
  try {
    ray::Init(cfg);
    std::printf("second_init=ok\n");
  } catch (const ray::internal::RayException&) {
    std::printf("second_init=threw\n");
  }
  ray::Shutdown();
  std::printf("after=%d\n", ray::IsInitialized() ? 1 : 0);
  try {
    ray::Put(1);
    std::printf("put_after_shutdown=ok\n");
  } catch (const ray::internal::RayException&) {
    std::printf("put_after_shutdown=threw\n");
  }
  ray::Shutdown();  // harmless when not initialized
  return 0;
}

// The embedded default, exiting without Shutdown (the runtime's exit handler must clean up).
// Prints the node and the pids of a task's and an actor's workers. The actor is created after
// the tasks are done (see ActorStartTest for creating one while a task waits for a worker).
TORUS_TEST_CHILD_SCENARIO(embedded_exit_without_shutdown) {
  ray::Init();
  std::printf("node=%s\n", ray::Task(InitNodeId).Remote().Get(30000)->c_str());
  std::printf("task_pid=%d\n", *ray::Task(InitPid).Remote().Get(30000));
  auto actor = ray::Actor(InitActor::Create).Remote();
  std::printf("actor_pid=%d\n", *actor.Task(&InitActor::Pid).Remote().Get(30000));
  auto big = ray::Put(std::vector<uint8_t>(1 << 20, 1));
  std::fflush(stdout);
  return 0;
}

namespace torus_test {
namespace {

std::string Field(const std::string& out, const std::string& key) {
  auto at = out.find(key + "=");
  if (at == std::string::npos) return "";
  at += key.size() + 1;
  return out.substr(at, out.find('\n', at) - at);
}

std::vector<std::string> SessionDirs(const std::string& root) {
  std::vector<std::string> out;
  DIR* d = opendir(root.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    if (std::string(e->d_name).rfind("session_", 0) == 0) out.push_back(e->d_name);
  }
  closedir(d);
  return out;
}

// No TestCluster is started: TestCluster only provides the private TORUS_TMPDIR and the process
// scan.
class EmbeddedTest : public ::testing::Test {};

TEST_F(EmbeddedTest, InitWithoutAddressStartsAPrivateClusterThatShutdownStops) {
  TestCluster env("embedded");
  ASSERT_FALSE(ray::IsInitialized());
  ray::Init();
  ASSERT_TRUE(ray::IsInitialized());
  std::string node = *ray::Task(InitNodeId).Remote().Get(kGetTimeoutMs);
  ASSERT_FALSE(node.empty());
  EXPECT_EQ(*ray::Task(InitPlus).Remote(1, 2).Get(kGetTimeoutMs), 3);
  auto actor = ray::Actor(InitActor::Create).Remote();
  std::vector<pid_t> workers = {*ray::Task(InitPid).Remote().Get(kGetTimeoutMs),
                                *actor.Task(&InitActor::Pid).Remote().Get(kGetTimeoutMs)};
  auto big = ray::Put(std::vector<uint8_t>(4 << 20, 1));
  EXPECT_EQ(big.Get(kGetTimeoutMs)->size(), 4u << 20);
  const std::string prefix = "torus." + node.substr(0, 12) + ".";
  EXPECT_FALSE(ShmSegments(prefix).empty()) << "a 4 MiB object should be in shared memory";
  for (pid_t p : workers) EXPECT_TRUE(ProcessRunning(p));

  ray::Shutdown();
  EXPECT_FALSE(ray::IsInitialized());
  EXPECT_THROW(ray::Put(1), ray::internal::RayException);
  for (pid_t p : workers) {
    EXPECT_TRUE(WaitUntil([&] { return !ProcessRunning(p); }, std::chrono::seconds(5)))
        << "worker " << DescribeProcess(p) << " outlived Shutdown()";
  }
  EXPECT_TRUE(WaitUntil([&] { return env.ClusterProcesses().empty(); }, std::chrono::seconds(5)));
  for (pid_t p : env.ClusterProcesses()) ADD_FAILURE() << "left: " << DescribeProcess(p);
  EXPECT_TRUE(ShmSegments(prefix).empty()) << "shared memory of the embedded node left behind";
  EXPECT_TRUE(SessionDirs(env.tmpdir()).empty()) << "session directory left in " << env.tmpdir();

  // And again, in the same process.
  ray::Init();
  std::string node2 = *ray::Task(InitNodeId).Remote().Get(kGetTimeoutMs);
  EXPECT_NE(node2, node);
  ray::Shutdown();
  EXPECT_TRUE(WaitUntil([&] { return env.ClusterProcesses().empty(); }, std::chrono::seconds(5)));
  EXPECT_TRUE(ShmSegments("torus." + node2.substr(0, 12) + ".").empty());
}

TEST_F(EmbeddedTest, DriverExitingWithoutShutdownLeavesNothing) {
  TestCluster env("embedded-exit");
  RunResult r = RunChild("embedded_exit_without_shutdown");
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  std::string node = Field(r.out, "node");
  ASSERT_FALSE(node.empty()) << r.Describe();
  for (const char* key : {"task_pid", "actor_pid"}) {
    pid_t p = std::atoi(Field(r.out, key).c_str());
    EXPECT_TRUE(WaitUntil([&] { return !ProcessRunning(p); }, std::chrono::seconds(5)))
        << key << " " << DescribeProcess(p) << " outlived its driver";
  }
  EXPECT_TRUE(WaitUntil([&] { return env.ClusterProcesses().empty(); }, std::chrono::seconds(5)));
  for (pid_t p : env.ClusterProcesses()) ADD_FAILURE() << "left: " << DescribeProcess(p);
  EXPECT_TRUE(ShmSegments("torus." + node.substr(0, 12) + ".").empty());
}

// With a cluster running: the embedded default still makes its own, and does not disturb it.
struct InitTest : ClusterTest<InitTest> {
  static constexpr const char* kName = "init";
  static constexpr bool kConnectDriver = false;
  static void Build(TestCluster& c) {
    c.StartHead(1);
    NodeSpec s;
    c.AddNode(s);
  }
};

TEST_F(InitTest, NoAddressMeansAPrivateClusterEvenWhenOneIsRunning) {
  RunResult r = RunChild("init_report");
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  std::string node = Field(r.out, "node");
  EXPECT_FALSE(node.empty()) << r.Describe();
  EXPECT_FALSE(AliveNodeIds(cluster()).count(node)) << "joined the running cluster";
  EXPECT_EQ(AliveNodeIds(cluster()).size(), 2u);
  EXPECT_NO_THROW(cluster().Status()) << "session_latest no longer points at the cluster";
}

TEST_F(InitTest, AddressFromTorusAddress) {
  RunResult r = RunChild("init_report", {{"TORUS_ADDRESS", cluster().address()}});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(AliveNodeIds(cluster()).count(Field(r.out, "node"))) << r.Describe();
}

TEST_F(InitTest, AddressFromRayAddress) {
  RunResult r = RunChild("init_report", {{"RAY_ADDRESS", cluster().address()}});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(AliveNodeIds(cluster()).count(Field(r.out, "node"))) << r.Describe();
}

TEST_F(InitTest, AddressFromConfigComesFirst) {
  RunResult r = RunChild("init_report", {{"TEST_CONFIG_ADDRESS", cluster().address()},
                                         {"TORUS_ADDRESS", "127.0.0.1:1"}});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(AliveNodeIds(cluster()).count(Field(r.out, "node"))) << r.Describe();
}

TEST_F(InitTest, AddressFromTheCommandLine) {
  RunResult r = RunChild("init_report", {{"TEST_ARGV_ADDRESS", cluster().address()}});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(AliveNodeIds(cluster()).count(Field(r.out, "node"))) << r.Describe();
}

TEST_F(InitTest, UnreachableAddressFailsInit) {
  std::string addr = "127.0.0.1:" + std::to_string(FreePort());
  RunResult r = RunChild("init_report", {{"TORUS_ADDRESS", addr}}, {}, 60);
  EXPECT_FALSE(r.timed_out);
  EXPECT_EQ(r.exit_code, 4) << r.Describe();
  EXPECT_NE(r.out.find(addr), std::string::npos) << "the error should name the address\n"
                                                  << r.Describe();
}

TEST_F(InitTest, LifecycleAndNamespace) {
  RunResult r = RunChild("init_report", {{"TORUS_ADDRESS", cluster().address()},
                                         {"TEST_NAMESPACE", "my_namespace"}});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(Field(r.out, "before"), "0");
  EXPECT_EQ(Field(r.out, "put_before_init"), "threw");
  EXPECT_EQ(Field(r.out, "initialized"), "1");
  EXPECT_EQ(Field(r.out, "namespace"), "my_namespace");
  EXPECT_EQ(Field(r.out, "second_init"), "threw");
  EXPECT_EQ(Field(r.out, "after"), "0");
  EXPECT_EQ(Field(r.out, "put_after_shutdown"), "threw");
  // Without one, each job gets its own anonymous namespace.
  RunResult a = RunChild("init_report", {{"TORUS_ADDRESS", cluster().address()}});
  RunResult b = RunChild("init_report", {{"TORUS_ADDRESS", cluster().address()}});
  EXPECT_FALSE(Field(a.out, "namespace").empty());
  EXPECT_NE(Field(a.out, "namespace"), Field(b.out, "namespace"));
}

}  // namespace
}  // namespace torus_test
