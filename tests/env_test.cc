// What a worker sees of its environment (TORUS_NODE_ID, TORUS_WORKER_ID, its node's variables),
// and where a task's output goes (the worker's log files, the driver's terminal).
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <ray/api.h>
#include <sstream>
#include <string>
#include <thread>
#include <utility>

#include "cluster_fixture.h"

namespace {
std::string Env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "<unset>";
}
}  // namespace

std::map<std::string, std::string> EnvOfTask() {
  return {{"TORUS_NODE_ID", Env("TORUS_NODE_ID")},
          {"TORUS_WORKER_ID", Env("TORUS_WORKER_ID")},
          {"TPU_NAME", Env("TPU_NAME")}};
}

class EnvActor {
 public:
  static EnvActor* Create() { return new EnvActor(); }
  std::map<std::string, std::string> Env() { return EnvOfTask(); }
};

int EnvPrint(std::string out_marker, std::string err_marker) {
  std::cout << out_marker << std::endl;
  std::cerr << err_marker << std::endl;
  std::printf("%s-printf\n", out_marker.c_str());
  std::fflush(stdout);
  return 1;
}

RAY_REMOTE(EnvOfTask, EnvActor::Create, &EnvActor::Env, EnvPrint);

// A driver (TORUS_ADDRESS) whose task prints TEST_MARKER to stdout and TEST_MARKER-err to stderr.
TORUS_TEST_CHILD_SCENARIO(print_from_task) {
  ray::Init();
  std::string marker = std::getenv("TEST_MARKER");
  ray::Task(EnvPrint).Remote(marker, marker + "-err").Get(30000);
  // Forwarded output is asynchronous (a 20 ms batch per pipe; longer on a loaded machine).
  std::this_thread::sleep_for(std::chrono::seconds(3));
  ray::Shutdown();
  return 0;
}

namespace torus_test {
namespace {

struct EnvTest : ClusterTest<EnvTest> {
  static constexpr const char* kName = "env";
  static inline ThreeNodes shape;
  static void Build(TestCluster& c) { shape.Build(c); }
};

TEST_F(EnvTest, WorkersSeeTheirNodeAndWorkerIds) {
  std::set<std::string> worker_ids;
  for (const auto& [res, node] : std::vector<std::pair<std::string, std::string>>{
           {"head_res", shape.head.node_id}, {"node_a", shape.a.node_id}, {"node_b", shape.b.node_id}}) {
    auto env = *ray::Task(EnvOfTask).SetResource(res, 1).Remote().Get(kGetTimeoutMs);
    EXPECT_EQ(env["TORUS_NODE_ID"], node) << "task pinned with " << res;
    EXPECT_NE(env["TORUS_WORKER_ID"], "<unset>");
    worker_ids.insert(env["TORUS_WORKER_ID"]);
  }
  EXPECT_EQ(worker_ids.size(), 3u) << "three nodes, three different workers";
  // The ids are the ones `torus list workers` reports.
  std::set<std::string> listed;
  for (const auto& w : cluster().ListJson("workers")) listed.insert(w.value("worker_id", ""));
  for (const auto& id : worker_ids) EXPECT_TRUE(listed.count(id)) << id << " not listed";

  auto actor = ray::Actor(EnvActor::Create).SetResource("node_a", 1).Remote();
  auto env = *actor.Task(&EnvActor::Env).Remote().Get(kGetTimeoutMs);
  EXPECT_EQ(env["TORUS_NODE_ID"], shape.a.node_id);
  EXPECT_NE(env["TORUS_WORKER_ID"], "<unset>");
  nlohmann::json worker = WorkerOfActor(cluster(), actor.ID());
  ASSERT_FALSE(worker.is_null());
  EXPECT_EQ(worker.value("worker_id", ""), env["TORUS_WORKER_ID"]);
}

TEST_F(EnvTest, WorkersInheritTheirNodesEnvironment) {
  auto on_a = *ray::Task(EnvOfTask).SetResource("node_a", 1).Remote().Get(kGetTimeoutMs);
  EXPECT_EQ(on_a["TPU_NAME"], "test-slice");
  auto on_b = *ray::Task(EnvOfTask).SetResource("node_b", 1).Remote().Get(kGetTimeoutMs);
  EXPECT_EQ(on_b["TPU_NAME"], "<unset>") << "node B was started without TPU_NAME";
  auto actor = ray::Actor(EnvActor::Create).SetResource("node_a", 1).Remote();
  EXPECT_EQ((*actor.Task(&EnvActor::Env).Remote().Get(kGetTimeoutMs))["TPU_NAME"], "test-slice");
}

struct LogTest : ClusterTest<LogTest> {
  static constexpr const char* kName = "log";
  static void Build(TestCluster& c) { c.StartHead(1); }
};

TEST_F(LogTest, EveryProcessHasALogInTheSessionDirectory) {
  std::string logs = cluster().session_dir() + "/logs";
  RunResult ls = RunProcess({"/bin/ls", logs});
  EXPECT_NE(ls.out.find("head"), std::string::npos) << ls.out;
  EXPECT_NE(ls.out.find("node"), std::string::npos) << ls.out;
  ray::Task(EnvOfTask).Remote().Get(kGetTimeoutMs);
  ls = RunProcess({"/bin/ls", logs});
  EXPECT_NE(ls.out.find("worker"), std::string::npos) << ls.out;
}

TEST_F(LogTest, WorkerOutputIsCapturedInItsLogFiles) {
  std::string marker = "captured-" + std::to_string(getpid());
  EXPECT_EQ(*ray::Task(EnvPrint).Remote(marker, marker + "-err").Get(kGetTimeoutMs), 1);
  std::string logs = cluster().session_dir() + "/logs";
  auto grep = [&](const std::string& what, const std::string& glob) {
    RunResult r = RunProcess({"/bin/sh", "-c", "cat '" + logs + "'/" + glob + " 2>/dev/null"});
    return r.out.find(what) != std::string::npos;
  };
  EXPECT_TRUE(WaitUntil([&] { return grep(marker + "\n", "worker-*.out"); }));
  EXPECT_TRUE(WaitUntil([&] { return grep(marker + "-printf", "worker-*.out"); }));
  EXPECT_TRUE(WaitUntil([&] { return grep(marker + "-err", "worker-*.err"); }));
}

// Ray shows a task's output in the driver's terminal, prefixed by where it ran.
TEST_F(LogTest, TaskOutputIsShownByTheDriverWithAPrefix) {
  std::string marker = "shown-" + std::to_string(getpid());
  RunResult r = RunChild("print_from_task",
                         {{"TORUS_ADDRESS", cluster().address()}, {"TEST_MARKER", marker}});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  auto line_with = [](const std::string& text, const std::string& what) {
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) {
      if (line.size() >= what.size() && line.compare(line.size() - what.size(), what.size(), what) == 0) {
        return line;
      }
    }
    return std::string();
  };
  std::string out_line = line_with(r.out, marker);
  ASSERT_FALSE(out_line.empty()) << "the task's stdout did not reach the driver\n" << r.Describe();
  EXPECT_GT(out_line.size(), marker.size()) << "no prefix: " << out_line;
  EXPECT_NE(out_line.find("pid="), std::string::npos) << out_line;
  std::string err_line = line_with(r.err, marker + "-err");
  EXPECT_FALSE(err_line.empty()) << "the task's stderr did not reach the driver's stderr\n"
                                 << r.Describe();
}

}  // namespace
}  // namespace torus_test
