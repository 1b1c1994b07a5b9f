// The torus CLI: status, list (JSON schema and table), errors for bad input, start/stop of heads
// and nodes (background and --block).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <ray/api.h>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"

class CliActor {
 public:
  static CliActor* Create() { return new CliActor(); }
  int Ping() { return 1; }
};

int CliPlus(int a, int b) { return a + b; }
int CliFail(int) { throw std::runtime_error("cli failure"); }

RAY_REMOTE(CliActor::Create, &CliActor::Ping, CliPlus, CliFail);

namespace torus_test {
namespace {

struct CliTest : ClusterTest<CliTest> {
  static constexpr const char* kName = "cli";
  static inline ThreeNodes shape;
  static void Build(TestCluster& c) { shape.Build(c); }
};

void ExpectFields(const nlohmann::json& entry, const std::vector<std::string>& fields) {
  for (const auto& f : fields) EXPECT_TRUE(entry.contains(f)) << "no field '" << f << "' in " << entry.dump();
}

TEST_F(CliTest, StatusShowsNodesResourcesAndDemands) {
  std::string status = cluster().Status();
  EXPECT_NE(status.find("Nodes"), std::string::npos) << status;
  for (const auto& n : cluster().nodes()) {
    EXPECT_NE(status.find(n.node_id.substr(0, 12)), std::string::npos) << n.node_id << "\n" << status;
    EXPECT_NE(status.find(n.address), std::string::npos) << n.address << "\n" << status;
  }
  EXPECT_NE(status.find("3 alive"), std::string::npos) << status;
  auto res = status.find("Resources");
  ASSERT_NE(res, std::string::npos) << status;
  for (const char* name : {"CPU", "custom", "node_a", "node_b", "head_res"}) {
    EXPECT_NE(status.find(name, res), std::string::npos) << name << "\n" << status;
  }
  EXPECT_NE(status.find("/ 6"), std::string::npos) << "6 CPUs in total\n" << status;
  EXPECT_NE(status.find("Pending demands"), std::string::npos) << status;
}

TEST_F(CliTest, ListNodesJson) {
  nlohmann::json nodes = cluster().ListJson("nodes");
  ASSERT_TRUE(nodes.is_array());
  ASSERT_EQ(nodes.size(), 3u) << nodes.dump(2);
  for (const auto& n : nodes) {
    ExpectFields(n, {"node_id", "address", "hostname", "state", "resources_total",
                     "resources_available", "labels"});
    EXPECT_EQ(n.value("state", ""), "ALIVE");
    EXPECT_TRUE(n["resources_total"].is_object());
    EXPECT_TRUE(n["labels"].is_object());
    EXPECT_EQ(n["resources_total"].value("CPU", 0.0), 2.0) << n.dump();
    if (n.value("node_id", "") == shape.a.node_id) {
      EXPECT_EQ(n.value("address", ""), shape.a.address);
      EXPECT_EQ(n["labels"].value("zone", ""), "a") << n.dump();
      EXPECT_EQ(n["resources_total"].value("node_a", 0.0), 100.0);
    }
    if (n.value("node_id", "") == shape.b.node_id) {
      EXPECT_EQ(n["labels"].value("zone", ""), "b") << n.dump();
      EXPECT_EQ(n["resources_total"].value("custom", 0.0), 1.0);
    }
  }
}

TEST_F(CliTest, ListActorsJson) {
  auto actor = ray::Actor(CliActor::Create).SetName("listed", "cli_ns").Remote();
  ASSERT_EQ(*actor.Task(&CliActor::Ping).Remote().Get(kGetTimeoutMs), 1);
  nlohmann::json actors = cluster().ListJson("actors");
  ASSERT_TRUE(actors.is_array());
  nlohmann::json entry = ActorEntry(cluster(), actor.ID());
  ASSERT_FALSE(entry.is_null()) << actors.dump(2);
  ExpectFields(entry, {"actor_id", "class_name", "name", "namespace", "state", "node_id",
                       "num_restarts", "death_cause", "job_id"});
  EXPECT_EQ(entry.value("name", ""), "listed");
  EXPECT_EQ(entry.value("namespace", ""), "cli_ns");
  EXPECT_EQ(entry.value("state", ""), "ALIVE");
  EXPECT_EQ(entry.value("num_restarts", -1), 0);
  EXPECT_NE(entry.value("class_name", "").find("CliActor"), std::string::npos) << entry.dump();
  EXPECT_TRUE(AliveNodeIds(cluster()).count(entry.value("node_id", ""))) << entry.dump();
  EXPECT_FALSE(entry.value("job_id", "").empty());
}

TEST_F(CliTest, ListObjectsJson) {
  ray::ObjectRef<std::vector<uint8_t>> big = ray::Put(std::vector<uint8_t>(1 << 20, 1));
  nlohmann::json objects = cluster().ListJson("objects");
  ASSERT_TRUE(objects.is_array());
  bool found = false;
  for (const auto& o : objects) {
    ExpectFields(o, {"object_id", "node_id", "size_bytes", "owner_address", "store_key", "offset"});
    if (o.value("object_id", "") == big.ID()) {
      found = true;
      EXPECT_GE(o.value("size_bytes", 0ll), 1 << 20);
      EXPECT_TRUE(AliveNodeIds(cluster()).count(o.value("node_id", "")));
      EXPECT_NE(big.ID().find(o.value("owner_address", "?")), std::string::npos)
          << "owner " << o.value("owner_address", "") << " of " << big.ID();
    }
  }
  EXPECT_TRUE(found) << "object " << big.ID() << " not in\n" << objects.dump(2);
}

TEST_F(CliTest, ListWorkersJson) {
  auto actor = ray::Actor(CliActor::Create).SetResource("node_b", 1).Remote();
  ASSERT_EQ(*actor.Task(&CliActor::Ping).Remote().Get(kGetTimeoutMs), 1);
  ASSERT_EQ(*ray::Task(CliPlus).SetResource("node_a", 1).Remote(1, 1).Get(kGetTimeoutMs), 2);
  nlohmann::json workers = cluster().ListJson("workers");
  ASSERT_TRUE(workers.is_array());
  ASSERT_FALSE(workers.empty());
  for (const auto& w : workers) {
    ExpectFields(w, {"worker_id", "node_id", "pid", "state", "actor_id"});
    EXPECT_TRUE(ProcessRunning(w.value("pid", 0))) << w.dump();
  }
  nlohmann::json mine = WorkerOfActor(cluster(), actor.ID());
  ASSERT_FALSE(mine.is_null()) << workers.dump(2);
  EXPECT_EQ(mine.value("node_id", ""), shape.b.node_id);
  EXPECT_EQ(mine.value("state", ""), "actor");
}

TEST_F(CliTest, ListTasksJson) {
  ray::ObjectRef<int> done = ray::Task(CliPlus).Remote(2, 2);
  ASSERT_EQ(*done.Get(kGetTimeoutMs), 4);
  ray::ObjectRef<int> failed = ray::Task(CliFail).Remote(0);
  EXPECT_THROW(failed.Get(kGetTimeoutMs), ray::internal::RayTaskException);
  RunResult r = cluster().Torus({"list", "tasks", "--format", "json"});
  ASSERT_EQ(r.exit_code, 0) << "`torus list tasks` (issue 2: list nodes|actors|tasks|objects)\n"
                            << r.Describe();
  nlohmann::json tasks = nlohmann::json::parse(r.out, nullptr, false);
  ASSERT_TRUE(tasks.is_array()) << r.out;
  auto hex_of = [](const std::string& id) { return id.substr(0, id.find('@')); };
  nlohmann::json done_entry, failed_entry;
  for (const auto& t : tasks) {
    ExpectFields(t, {"task_id", "name", "state", "job_id", "actor_id", "worker_id", "attempt",
                     "error", "submitted_ms"});
    if (t.value("task_id", "") == hex_of(done.ID())) done_entry = t;
    if (t.value("task_id", "") == hex_of(failed.ID())) failed_entry = t;
  }
  ASSERT_FALSE(done_entry.is_null()) << "task " << done.ID() << " not in\n" << tasks.dump(2);
  EXPECT_EQ(done_entry.value("name", ""), "CliPlus");
  EXPECT_EQ(done_entry.value("state", ""), "FINISHED");
  EXPECT_EQ(done_entry.value("attempt", -1), 0);
  EXPECT_FALSE(done_entry.value("worker_id", "").empty());
  EXPECT_EQ(done_entry.value("job_id", "").size(), 8u) << done_entry.dump();
  ASSERT_FALSE(failed_entry.is_null()) << tasks.dump(2);
  EXPECT_EQ(failed_entry.value("state", ""), "FAILED");
  EXPECT_NE(failed_entry.value("error", "").find("cli failure"), std::string::npos)
      << failed_entry.dump();
}

TEST_F(CliTest, ListTableFormat) {
  RunResult r = cluster().Torus({"list", "nodes"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.out.find("node_id"), std::string::npos) << r.out;
  for (const auto& n : cluster().nodes()) EXPECT_NE(r.out.find(n.node_id), std::string::npos);
  r = cluster().Torus({"list", "actors", "--format", "table"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
}

TEST_F(CliTest, ListOfAnUnknownKindFailsClearly) {
  RunResult r = cluster().Torus({"list", "bogus"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("bogus"), std::string::npos) << r.Describe();
  EXPECT_NE(r.err.find("nodes"), std::string::npos) << "the error should list the valid kinds\n"
                                                    << r.Describe();
  r = cluster().Torus({"list", "nodes", "--format", "xml"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("--format"), std::string::npos) << r.Describe();
  r = cluster().Torus({"list"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  r = cluster().Torus({"frobnicate"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("frobnicate"), std::string::npos) << r.Describe();
}

TEST_F(CliTest, StatusAndListTakeAnExplicitAddress) {
  // From anywhere: no session under TORUS_TMPDIR, address and token given.
  std::map<std::string, std::string> env = {{"TORUS_TMPDIR", cluster().tmpdir() + "/elsewhere"},
                                            {"TORUS_TOKEN", cluster().token()}};
  RunResult r = cluster().Torus({"status", "--address", cluster().address()}, env);
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  r = cluster().Torus({"list", "nodes", "--format", "json", "--address", cluster().address()}, env);
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  env["TORUS_ADDRESS"] = cluster().address();
  r = cluster().Torus({"status"}, env);
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
}

// ------------------------------------------------------------------------------- start / stop

// Each test makes its own (or no) cluster.
class CliStartTest : public ::testing::Test {};

TEST_F(CliStartTest, BadResourcesJsonIsRefusedNamingTheFlag) {
  TestCluster c("badres");
  RunResult r = c.Torus({"start", "--head", "--port", std::to_string(FreePort()), "--resources",
                         "{bad json"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("--resources"), std::string::npos) << r.Describe();
  EXPECT_TRUE(c.ClusterProcesses().empty()) << "a refused start left processes behind";
  r = c.Torus({"start", "--head", "--port", std::to_string(FreePort()), "--resources", "[1, 2]"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("--resources"), std::string::npos) << r.Describe();
  r = c.Torus({"start", "--head", "--port", std::to_string(FreePort()), "--resources",
               "{\"x\": -1}"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("--resources"), std::string::npos) << r.Describe();
  r = c.Torus({"start", "--address", "127.0.0.1:1", "--resources", "{bad json"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("--resources"), std::string::npos) << r.Describe();
  EXPECT_TRUE(c.ClusterProcesses().empty());
}

TEST_F(CliStartTest, OtherBadOptionsAreRefusedNamingTheFlag) {
  TestCluster c("badopts");
  RunResult r = c.Torus({"start", "--head", "--port", std::to_string(FreePort()), "--labels",
                         "novalue"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("--labels"), std::string::npos) << r.Describe();
  r = c.Torus({"start", "--head", "--port", std::to_string(FreePort()), "--num-cpus", "many"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("--num-cpus"), std::string::npos) << r.Describe();
  r = c.Torus({"start"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("--head"), std::string::npos) << r.Describe();
  r = c.Torus({"start", "--head", "--port", "notaport"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("port"), std::string::npos) << r.Describe();
  EXPECT_TRUE(c.ClusterProcesses().empty());
}

// --object-store-memory (Ray's flag) sizes the node's store; `torus status` shows the stores'
// use and capacity; a bad size is refused before anything starts, naming the flag.
TEST_F(CliStartTest, ObjectStoreMemorySizesTheStoreAndStatusShowsIt) {
  TestCluster c("storesize");
  c.StartHead(1, {}, {}, {"--object-store-memory", "67108864"});
  std::string status = c.Status();
  auto line = status.find("object store");
  ASSERT_NE(line, std::string::npos) << status;
  EXPECT_NE(status.find("/ 64.0 MiB", line), std::string::npos) << status;
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
  TestCluster bad("storesize-bad");
  RunResult r = bad.Torus({"start", "--head", "--port", std::to_string(FreePort()),
                           "--object-store-memory", "12"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find("--object-store-memory"), std::string::npos) << r.Describe();
  EXPECT_TRUE(bad.ClusterProcesses().empty());
}

TEST_F(CliStartTest, UnreachableHeadIsReported) {
  TestCluster c("unreachable");
  c.StartHead(1);  // a session with a token, so the failure is about reaching the head
  RunResult r = c.Torus({"start", "--address", "127.0.0.1:" + std::to_string(FreePort())}, {}, {},
                        30);
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_FALSE(r.timed_out);
  EXPECT_NE(r.err.find("cannot reach"), std::string::npos) << r.Describe();
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
}

TEST_F(CliStartTest, HeadPortInUseIsReported) {
  TestCluster c("portinuse");
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  socklen_t len = sizeof addr;
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int port = ntohs(addr.sin_port);
  RunResult r = c.Torus({"start", "--head", "--port", std::to_string(port)});
  close(fd);
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_NE(r.err.find(std::to_string(port)), std::string::npos) << r.Describe();
  EXPECT_TRUE(WaitUntil([&] { return c.ClusterProcesses().empty(); }, std::chrono::seconds(5)));
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
}

TEST_F(CliStartTest, BackgroundNodeOutlivesTheCommandAndStopStopsEverything) {
  TestCluster c("startstop");
  c.StartHead(1, {}, {{"role", "head"}});
  NodeSpec s;
  s.block = false;
  s.labels = {{"zone", "x"}, {"tier", "gold"}};
  NodeInfo n = c.AddNode(s);  // returns after `torus start --address` has exited
  EXPECT_TRUE(ProcessRunning(n.pid));
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  nlohmann::json nodes = c.ListJson("nodes");
  bool found = false;
  for (const auto& j : nodes) {
    if (j.value("node_id", "") != n.node_id) continue;
    found = true;
    EXPECT_EQ(j.value("state", ""), "ALIVE");
    EXPECT_EQ(j["labels"].value("zone", ""), "x") << j.dump();
    EXPECT_EQ(j["labels"].value("tier", ""), "gold") << j.dump();
  }
  EXPECT_TRUE(found) << nodes.dump(2);
  EXPECT_GE(c.ClusterProcesses().size(), 3u) << "head, its node, the added node";

  size_t running = c.ClusterProcesses().size();
  RunResult stop = c.Torus({"stop"});
  EXPECT_EQ(stop.exit_code, 0) << stop.Describe();
  EXPECT_NE(stop.out.find("Stopped " + std::to_string(running) + " Torus process"),
            std::string::npos)
      << running << " processes were running\n" << stop.Describe();
  std::vector<pid_t> left;
  EXPECT_TRUE(WaitUntil([&] { return (left = c.ClusterProcesses()).empty(); },
                        std::chrono::seconds(10)));
  for (pid_t p : left) ADD_FAILURE() << "left after torus stop: " << DescribeProcess(p);
  RunResult status = c.Torus({"status"}, {}, {}, 20);
  EXPECT_NE(status.exit_code, 0) << "status of a stopped cluster\n" << status.Describe();
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
}

TEST_F(CliStartTest, BlockingNodeLeavesTheClusterOnSigterm) {
  TestCluster c("blocknode");
  c.StartHead(1);
  NodeSpec s;
  s.block = true;
  NodeInfo n = c.AddNode(s);
  ASSERT_TRUE(n.owned);
  ASSERT_EQ(kill(n.pid, SIGTERM), 0);
  int status = 0;
  bool exited = WaitUntil([&] { return waitpid(n.pid, &status, WNOHANG) == n.pid; },
                          std::chrono::seconds(10));
  EXPECT_TRUE(exited) << "torus start --block ignored SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "torus start --block did not exit cleanly on SIGTERM: wait status " << status
      << (WIFSIGNALED(status) ? " (killed by the signal: it was not handled)" : "");
  EXPECT_TRUE(ShmSegments("torus." + n.node_id.substr(0, 12) + ".").empty())
      << "the node's shared memory is still in /dev/shm";
  EXPECT_TRUE(WaitUntil([&] {
    for (const auto& j : c.ListJson("nodes")) {
      if (j.value("node_id", "") == n.node_id) return j.value("state", "") == "DEAD";
    }
    return false;
  })) << c.Torus({"list", "nodes"}).out;
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
}

TEST_F(CliStartTest, BlockingHeadRunsInTheForegroundUntilSigterm) {
  TestCluster c("blockhead");
  int port = FreePort();
  pid_t pid = SpawnProcess({TORUS_BIN, "start", "--head", "--block", "--port", std::to_string(port),
                            "--num-cpus", "1"},
                           {{"TORUS_TMPDIR", c.tmpdir()}}, {}, c.tmpdir() + "/head.out",
                           c.tmpdir() + "/head.err");
  std::string address = "127.0.0.1:" + std::to_string(port);
  RunResult r;
  EXPECT_TRUE(WaitUntil([&] {
    r = c.Torus({"list", "nodes", "--format", "json", "--address", address}, {}, {}, 10);
    return r.exit_code == 0 && nlohmann::json::parse(r.out, nullptr, false).size() == 1;
  })) << r.Describe() << ReadFileOr(c.tmpdir() + "/head.err");
  ASSERT_EQ(kill(pid, SIGTERM), 0);
  int status = 0;
  EXPECT_TRUE(WaitUntil([&] { return waitpid(pid, &status, WNOHANG) == pid; },
                        std::chrono::seconds(10)));
  EXPECT_TRUE(WaitUntil([&] { return c.ClusterProcesses().empty(); }, std::chrono::seconds(5)));
  for (pid_t p : c.ClusterProcesses()) {
    ADD_FAILURE() << "left: " << DescribeProcess(p);
    kill(p, SIGKILL);
  }
}

TEST_F(CliStartTest, StatusWithoutAClusterSaysSo) {
  TestCluster c("nocluster");
  RunResult r = c.Torus({"status"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_FALSE(r.err.empty()) << r.Describe();
  EXPECT_FALSE(r.timed_out);
}

}  // namespace
}  // namespace torus_test
