// Hardening of the CLI and of what enters the cluster (issue 13): invalid resource amounts and
// reserved labels are refused on every path (CLI flags, the C++ API, hand-made RPCs), the shared
// memory of a killed node is cleaned up, and the CLI behaves as a newcomer expects.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <ray/api.h>
#include <string>
#include <vector>

#include "cluster_fixture.h"
#include "proto/torus.grpc.pb.h"
#include "raw_rpc.h"

int HardeningPlus(int a, int b) { return a + b; }
RAY_REMOTE(HardeningPlus);

// A driver given `--ray_address ADDR` (two arguments): it must join that cluster (which has the
// resource "custom"), not start a private one.
TORUS_TEST_CHILD_SCENARIO(hardening_ray_address) {
  std::string cmdline = torus_test::ReadFileOr("/proc/self/cmdline");
  std::vector<std::string> args;
  for (size_t start = 0; start < cmdline.size();) {
    size_t end = cmdline.find('\0', start);
    if (end == std::string::npos) end = cmdline.size();
    args.push_back(cmdline.substr(start, end - start));
    start = end + 1;
  }
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  ray::RayConfig config;
  ray::Init(config, static_cast<int>(argv.size()), argv.data());
  int rc = 1;
  try {
    rc = *ray::Task(HardeningPlus).SetResource("custom", 1).Remote(1, 2).Get(20000) == 3 ? 0 : 1;
  } catch (const std::exception& e) {
    fprintf(stderr, "%s\n", e.what());
  }
  ray::Shutdown();
  return rc;
}

namespace torus_test {
namespace {

namespace rpc = torus::rpc;
std::unique_ptr<grpc::ClientContext> Context(const std::string& token, int deadline_ms = 5000) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata("torus-token", token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  return ctx;
}


// ------------------------------------------------------------------------------- without a cluster

class HardeningCliStart : public ::testing::Test {};

// Issue 13 item 5: `--num-cpus -3` used to give a node CPU: -3 (a CPU task then waited forever).
TEST_F(HardeningCliStart, InvalidResourceAmountsAreRefusedNamingFlagAndValue) {
  TestCluster c("badamounts");
  struct Case {
    std::vector<std::string> flags;
    std::vector<std::string> expect;
  };
  std::vector<Case> cases = {
      {{"--num-cpus", "-3"}, {"--num-cpus", "-3", "negative"}},
      {{"--num-cpus", "nan"}, {"--num-cpus", "nan"}},
      {{"--num-cpus", "inf"}, {"--num-cpus", "inf"}},
      {{"--num-cpus", "4abc"}, {"--num-cpus", "'4abc' is not a number"}},
      {{"--num-cpus", "1e15"}, {"--num-cpus", "too large"}},
      {{"--num-gpus", "-1"}, {"--num-gpus", "GPU = -1"}},
      {{"--memory", "1e30"}, {"--memory", "too large"}},
      {{"--resources", "{\"custom\": 1e20}"}, {"--resources", "custom = 1e+20", "too large"}},
      {{"--resources", "{\"custom\": \"two\"}"}, {"--resources", "custom", "\"two\""}},
  };
  for (const auto& k : cases) {
    std::vector<std::string> args = {"start", "--head", "--port", std::to_string(FreePort())};
    args.insert(args.end(), k.flags.begin(), k.flags.end());
    RunResult r = c.Torus(args);
    EXPECT_NE(r.exit_code, 0) << k.flags[1] << "\n" << r.Describe();
    for (const auto& e : k.expect) EXPECT_TRUE(Contains(r.err, e)) << "want '" << e << "'\n" << r.Describe();
    if (r.exit_code == 0) c.Torus({"stop"});
  }
  RunResult r = c.Torus({"start", "--address", "127.0.0.1:1", "--num-cpus", "-3"});
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "--num-cpus")) << r.Describe();
  EXPECT_TRUE(c.ClusterProcesses().empty()) << "a refused start left processes behind";
}

// Issue 13 item 6: reserved keys used to be accepted and shown by `torus list nodes`.
TEST_F(HardeningCliStart, ReservedLabelsAreRefusedNamingTheKey) {
  TestCluster c("badlabels");
  const std::pair<const char*, const char*> cases[] = {
      {"torus.io/node-id=fake,torus.io/hostname=evil", "torus.io/"},
      {"torus.io/hostname=evil", "torus.io/hostname"},
      {"team=a,torus.io/anything=x", "torus.io/anything"},
      {"ray.io/tpu-worker-id=3", "ray.io/tpu-worker-id"},
      {"torus.io/node-group=g", "torus.io/node-group"},
  };
  for (const auto& [labels, key] : cases) {
    RunResult r = c.Torus({"start", "--head", "--port", std::to_string(FreePort()), "--labels", labels});
    EXPECT_NE(r.exit_code, 0) << labels << "\n" << r.Describe();
    EXPECT_TRUE(Contains(r.err, "reserved")) << r.Describe();
    EXPECT_TRUE(Contains(r.err, key)) << "want '" << key << "'\n" << r.Describe();
    if (r.exit_code == 0) c.Torus({"stop"});
  }
  EXPECT_TRUE(c.ClusterProcesses().empty()) << "a refused start left processes behind";
}

// Threads /proc lists for `pid` (0 once it is reaped). A SIGKILLed process's main thread can be
// a zombie while its other threads are still exiting.
int LiveThreads(pid_t pid) {
  std::error_code ec;
  int n = 0;
  for (auto it = std::filesystem::directory_iterator("/proc/" + std::to_string(pid) + "/task", ec);
       !ec && it != std::filesystem::directory_iterator(); it.increment(ec)) {
    ++n;
  }
  return n;
}

// Issue 13 item 7: a SIGKILLed node's arena stayed in /dev/shm; `torus stop` left it too.
TEST_F(HardeningCliStart, KilledNodesSharedMemoryIsRemovedByNextStartAndByStop) {
  TestCluster c("shmleak");
  c.StartHead(1);
  auto kill_node = [&](const NodeInfo& n) {
    std::string prefix = "torus." + n.node_id.substr(0, 12) + ".";
    EXPECT_FALSE(ShmSegments(prefix).empty()) << "the node has no arena to leak";
    c.KillNode(n);
    // Dead means every thread gone, not only the main one a zombie: the node's arena lock (an
    // flock) is released when its last thread has exited, and only then may the next start
    // clean up.
    EXPECT_TRUE(WaitUntil([&] { return !ProcessRunning(n.pid) && LiveThreads(n.pid) <= 1; },
                          std::chrono::seconds(10)));
    return prefix;
  };
  std::string first = kill_node(c.AddNode({}));
  EXPECT_FALSE(ShmSegments(first).empty()) << "SIGKILL cannot clean up: the test shows nothing";
  NodeInfo second = c.AddNode({});  // the next start in the session cleans the dead node's arena
  EXPECT_TRUE(ShmSegments(first).empty()) << ShmSegments(first).size() << " segment(s) left after the next start";
  std::string second_prefix = kill_node(second);
  RunResult r = c.Torus({"stop"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(ShmSegments(second_prefix).empty()) << ShmSegments(second_prefix).size()
                                                  << " segment(s) left after torus stop";
}

// Issue 13 item 7: every node of a host claimed 30 % of RAM for its arena and 70 % as `memory`.
TEST_F(HardeningCliStart, NodesOfOneHostShareTheArenaAndMemoryBudget) {
  TestCluster c("shmshare");
  c.StartHead(1);
  c.AddNode({});
  c.AddNode({});
  const std::string token = c.token();
  std::vector<uint64_t> arenas;
  for (const auto& n : c.nodes()) {
    auto stub = rpc::Node::NewStub(Channel(n.address));
    rpc::NodeInfoReply info;
    auto ctx = Context(token);
    ASSERT_TRUE(stub->Info(ctx.get(), rpc::Empty(), &info).ok());
    arenas.push_back(info.arena_capacity());
  }
  ASSERT_EQ(arenas.size(), 3u);
  EXPECT_GT(arenas[2], 0u);
  EXPECT_LE(arenas[1], arenas[0] / 2 + 4096) << "the second node of the host took a whole budget";
  EXPECT_LE(arenas[2], arenas[0] / 3 + 4096) << "the third node of the host took a whole budget";
  std::map<std::string, double> memory;
  for (const auto& n : c.ListJson("nodes")) memory[n.value("node_id", "")] = n["resources_total"].value("memory", 0.0);
  EXPECT_LE(memory[c.nodes()[2].node_id], memory[c.nodes()[0].node_id] / 3 + 1)
      << "every node claimed 70 % of RAM as memory";
}


// Issue 13 item 10: help, version and mistyped flags.
TEST_F(HardeningCliStart, HelpVersionAndUnknownFlags) {
  TestCluster c("help");
  RunResult r = c.Torus({"--help"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "job submit")) << "torus --help does not list job\n" << r.Describe();
  r = c.Torus({"--version"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.out.rfind("torus ", 0), 0u) << r.Describe();
  r = c.Torus({"job", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "torus job submit")) << "help must go to stdout\n" << r.Describe();
  r = c.Torus({"status", "--help"});
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.out, "usage")) << r.Describe();
  struct Typo {
    std::vector<std::string> args;
    std::string typo, suggestion;
  };
  const std::vector<Typo> typos = {
      {{"status", "--adress", "127.0.0.1:1"}, "--adress", "--address"},
      {{"list", "nodes", "--formt", "json"}, "--formt", "--format"},
      {{"start", "--head", "--num-cpu", "2"}, "--num-cpu", "--num-cpus"},
      {{"stop", "--forse"}, "--forse", "--force"},
      {{"job", "submit", "--slcie", "4x4", "--", "true"}, "--slcie", "--slice"},
      {{"job", "list", "--adress", "x"}, "--adress", "--address"},
      {{"up", "--wiat", "x.yaml"}, "--wiat", "--wait"},
      {{"down", "--sesion-dir", "x"}, "--sesion-dir", "--session-dir"},
  };
  for (const auto& t : typos) {
    r = c.Torus(t.args, {}, {}, 20);
    EXPECT_EQ(r.exit_code, 2) << t.typo << "\n" << r.Describe();
    EXPECT_TRUE(Contains(r.err, "unknown flag " + t.typo)) << r.Describe();
    EXPECT_TRUE(Contains(r.err, "did you mean " + t.suggestion)) << r.Describe();
  }
  EXPECT_TRUE(c.ClusterProcesses().empty());
}

// Issue 13 item 10: after the cluster is stopped, `torus status` pointed at it still.
TEST_F(HardeningCliStart, StatusAfterStopSaysNoClusterIsRunning) {
  TestCluster c("stopped");
  c.StartHead(1);
  RunResult r = c.Torus({"stop"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  r = c.Torus({"status"}, {}, {}, 30);
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "no Torus cluster is running")) << r.Describe();
}

// ------------------------------------------------------------------------------- with a cluster

struct HardeningCli : ClusterTest<HardeningCli> {
  static constexpr const char* kName = "hardening";
  static void Build(TestCluster& c) { c.StartHead(1, {{"custom", 1}}, {{"zone", "z"}}); }
};

TEST_F(HardeningCli, ApiRefusesInvalidResourcesAtSubmit) {
  auto expect_throw = [](const std::function<void()>& f, const std::string& want) {
    try {
      f();
      ADD_FAILURE() << "no exception; wanted one with '" << want << "'";
    } catch (const ray::internal::RayException& e) {
      EXPECT_TRUE(Contains(e.what(), want)) << "want '" << want << "' in: " << e.what();
    }
  };
  expect_throw([] { ray::Task(HardeningPlus).SetResource("CPU", 2e15).Remote(1, 2); }, "too large");
  expect_throw([] { ray::Task(HardeningPlus).SetResource("custom", std::nan("")).Remote(1, 2); },
               "not a number");
  expect_throw(
      [] {
        ray::PlacementGroupCreationOptions o{"", {{{"CPU", 1}}, {{"CPU", 1e15}}}, ray::PlacementStrategy::PACK};
        ray::CreatePlacementGroup(o);
      },
      "bundle 1");
  expect_throw(
      [] {
        ray::PlacementGroupCreationOptions o{"", {{{"CPU", -1}}}, ray::PlacementStrategy::PACK};
        ray::CreatePlacementGroup(o);
      },
      "CPU = -1");
  // Valid work still runs.
  EXPECT_EQ(*ray::Task(HardeningPlus).Remote(1, 2).Get(kGetTimeoutMs), 3);
}

TEST_F(HardeningCli, NodeAndHeadRefuseInvalidResourcesInHandMadeRpcs) {
  const std::string token = cluster().token();
  auto node = rpc::Node::NewStub(Channel(cluster().head_node().address));
  {
    rpc::LeaseRequest req;
    (*req.mutable_resources()->mutable_units())["CPU"] = -5 * kUnits;
    req.set_runtime_key("exe:/bin/true");
    req.set_executable("/bin/true");
    rpc::LeaseReply reply;
    auto ctx = Context(token, 5000);
    auto st = node->RequestLease(ctx.get(), req, &reply);
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_FALSE(reply.granted());
    EXPECT_TRUE(Contains(reply.error().message(), "CPU = -5")) << reply.error().message();
  }
  auto head = rpc::Head::NewStub(Channel(cluster().address()));
  {
    rpc::RegisterNodeRequest req;
    auto* n = req.mutable_node();
    n->set_node_id("fake-node-with-negative-cpus");
    n->set_address("127.0.0.1:1");
    n->set_alive(true);
    (*n->mutable_total()->mutable_units())["CPU"] = -3 * kUnits;
    rpc::RegisterNodeReply reply;
    auto ctx = Context(token);
    ASSERT_TRUE(head->RegisterNode(ctx.get(), req, &reply).ok());
    EXPECT_NE(reply.error().code(), 0);
    EXPECT_TRUE(Contains(reply.error().message(), "CPU = -3")) << reply.error().message();
  }
  {
    rpc::PlacementGroupRecord req;
    req.set_pg_id("ffffffffffffffffffffffff");
    req.set_strategy("PACK");
    (*req.add_bundles()->mutable_resources()->mutable_units())["CPU"] = 200000000000000 * kUnits;
    rpc::CreatePlacementGroupReply reply;
    auto ctx = Context(token);
    ASSERT_TRUE(head->CreatePlacementGroup(ctx.get(), req, &reply).ok());
    EXPECT_NE(reply.error().code(), 0);
    EXPECT_TRUE(Contains(reply.error().message(), "too large")) << reply.error().message();
  }
  for (const auto& n : cluster().ListJson("nodes")) {
    EXPECT_NE(n.value("node_id", ""), "fake-node-with-negative-cpus") << "the head took the node";
    EXPECT_GE(n["resources_available"].value("CPU", 0.0), 0.0) << n.dump();
  }
}

// A caller repeats a create whose answer it lost (its head died): the id it minted finds the
// group the first call made; removing twice, or a group the head never knew, is not an error
// (as in Ray); an id that is not one is refused.
TEST_F(HardeningCli, RepeatedCreateFindsTheFirstGroupAndRemoveIsIdempotent) {
  const std::string token = cluster().token();
  auto head = rpc::Head::NewStub(Channel(cluster().address()));
  const std::string id = "0123456789abcdef0123456789ab";
  auto create = [&](const std::string& pg_id, rpc::CreatePlacementGroupReply* reply) {
    rpc::PlacementGroupRecord req;
    req.set_pg_id(pg_id);
    req.set_name("made-once");
    req.set_strategy("PACK");
    (*req.add_bundles()->mutable_resources()->mutable_units())["CPU"] = kUnits / 4;
    auto ctx = Context(token);
    return head->CreatePlacementGroup(ctx.get(), req, reply);
  };
  rpc::CreatePlacementGroupReply first, second, bad;
  ASSERT_TRUE(create(id, &first).ok());
  ASSERT_EQ(first.error().code(), 0) << first.error().message();
  ASSERT_TRUE(create(id, &second).ok());
  EXPECT_EQ(second.error().code(), 0) << "a repeated create is no name clash: " << second.error().message();
  EXPECT_EQ(first.pg_id(), id);
  EXPECT_EQ(second.pg_id(), id);
  int made = 0;
  for (const auto& p : cluster().ListJson("placement-groups")) made += p.value("name", "") == "made-once";
  EXPECT_EQ(made, 1);
  ASSERT_TRUE(create("not-an-id", &bad).ok());
  EXPECT_TRUE(Contains(bad.error().message(), "not-an-id")) << bad.error().message();
  for (const std::string& pg : {id, id, std::string("fedcba9876543210fedcba987654")}) {
    rpc::PlacementGroupRequest req;
    req.set_pg_id(pg);
    rpc::Empty e;
    auto ctx = Context(token);
    auto st = head->RemovePlacementGroup(ctx.get(), req, &e);
    EXPECT_TRUE(st.ok()) << pg << ": " << st.error_message();
  }
}

TEST_F(HardeningCli, HeadRefusesSpoofedLabelsInHandMadeRegistrations) {
  const std::string token = cluster().token();
  auto head = rpc::Head::NewStub(Channel(cluster().address()));
  auto try_register = [&](const std::string& key, const std::string& value) {
    rpc::RegisterNodeRequest req;
    auto* n = req.mutable_node();
    n->set_node_id("fake-node-spoofing-labels");
    n->set_hostname("realhost");
    n->set_address("127.0.0.1:1");
    n->set_alive(true);
    (*n->mutable_total()->mutable_units())["CPU"] = kUnits;
    (*n->mutable_labels())["torus.io/node-id"] = "fake-node-spoofing-labels";
    (*n->mutable_labels())["torus.io/hostname"] = "realhost";
    (*n->mutable_labels())[key] = value;
    rpc::RegisterNodeReply reply;
    auto ctx = Context(token);
    EXPECT_TRUE(head->RegisterNode(ctx.get(), req, &reply).ok());
    return reply.error().message();
  };
  EXPECT_TRUE(Contains(try_register("torus.io/node-id", "other-node"), "torus.io/node-id"));
  EXPECT_TRUE(Contains(try_register("torus.io/hostname", "evil"), "torus.io/hostname"));
  EXPECT_TRUE(Contains(try_register("torus.io/made-up", "x"), "torus.io/made-up"));
  EXPECT_TRUE(Contains(try_register("ray.io/tpu-slice-name", "s"), "ray.io/tpu-slice-name"));
  for (const auto& n : cluster().ListJson("nodes")) {
    EXPECT_NE(n.value("node_id", ""), "fake-node-spoofing-labels") << "the head took the node";
  }
  // The real node's own identity labels are there.
  auto nodes = cluster().ListJson("nodes");
  ASSERT_FALSE(nodes.empty());
  EXPECT_EQ(nodes[0]["labels"].value("torus.io/node-id", ""), nodes[0].value("node_id", ""));
  EXPECT_EQ(nodes[0]["labels"].value("zone", ""), "z");
}

TEST_F(HardeningCli, StatusPrintsBytesHumanReadably) {
  std::string status = cluster().Status();
  auto mem = status.find("memory", status.find("Resources"));
  ASSERT_NE(mem, std::string::npos) << status;
  std::string line = status.substr(mem, status.find('\n', mem) - mem);
  EXPECT_TRUE(Contains(line, "iB")) << line;
  EXPECT_FALSE(Contains(line, "e+")) << line;
}

TEST_F(HardeningCli, ListPlacementGroupsTableStartsWithTheId) {
  ray::PlacementGroupCreationOptions o{"readable", {{{"CPU", 0.5}}}, ray::PlacementStrategy::PACK};
  ray::PlacementGroup pg = ray::CreatePlacementGroup(o);
  ASSERT_TRUE(pg.Wait(30));
  RunResult r = cluster().Torus({"list", "placement-groups"});
  ASSERT_EQ(r.exit_code, 0) << r.Describe();
  EXPECT_EQ(r.out.rfind("placement_group_id", 0), 0u) << r.out;
  EXPECT_TRUE(Contains(r.out, pg.GetID())) << r.out;
  EXPECT_FALSE(Contains(r.out, "[{")) << "raw JSON in the table\n" << r.out;
  ray::RemovePlacementGroup(pg.GetID());
}

TEST_F(HardeningCli, StatusCountsWaitingTasksNotLeaseRequests) {
  std::vector<ray::ObjectRef<int>> refs;
  for (int i = 0; i < 60; ++i) refs.push_back(ray::Task(HardeningPlus).SetResource("nowhere", 1).Remote(i, 1));
  std::string status;
  EXPECT_TRUE(WaitUntil([&] {
    status = cluster().Status();
    return Contains(status, "60 task(s) waiting");
  })) << status;
}

TEST_F(HardeningCli, DriverTakesRayAddressAsTwoArguments) {
  char exe[4096] = {0};
  ASSERT_GT(readlink("/proc/self/exe", exe, sizeof exe - 1), 0);
  RunResult r = RunProcess({exe, "--ray_address", cluster().address()},
                           {{"TORUS_TEST_CHILD", "hardening_ray_address"}}, {"TORUS_ADDRESS", "RAY_ADDRESS"}, 90);
  EXPECT_EQ(r.exit_code, 0) << r.Describe();
}

TEST_F(HardeningCli, JobSubmitTimeoutBoundsTheWaitForASlice) {
  auto t0 = std::chrono::steady_clock::now();
  RunResult r = cluster().Torus({"job", "submit", "--slice", "4x4", "--accelerator", "v6e", "--timeout", "2", "--",
                                 "/bin/true"},
                                {}, {}, 40);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_FALSE(r.timed_out) << "the job waited for a slice that does not exist\n" << r.Describe();
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_LT(secs, 30) << r.Describe();
  // It says that no such slice exists, at submit and in the job's final message.
  EXPECT_NE(r.err.find("no v6e-16 (4x4) slice exists in this cluster"), std::string::npos)
      << r.Describe();
  EXPECT_NE(r.err.find("no such slice is in the cluster"), std::string::npos) << r.Describe();
}

}  // namespace
}  // namespace torus_test
