// Failures: task exceptions, actor method exceptions, worker processes that die (SIGKILL, abort,
// SIGSEGV) and the retries that follow, unregistered functions, and a node that dies.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <map>
#include <ray/api.h>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"
#include "proto/torus.grpc.pb.h"

namespace {

// Claims the next attempt number in `dir` (attempt-0, attempt-1, ...) and records this worker's
// pid in pid-<n>. Returns n.
int RecordAttempt(const std::string& dir) {
  for (int n = 0;; ++n) {
    std::string claim = dir + "/attempt-" + std::to_string(n);
    int fd = open(claim.c_str(), O_CREAT | O_EXCL | O_WRONLY, 0644);
    if (fd < 0) continue;
    close(fd);
    std::string tmp = dir + "/.pid-" + std::to_string(n);
    {
      std::ofstream out(tmp);
      out << getpid();
    }
    rename(tmp.c_str(), (dir + "/pid-" + std::to_string(n)).c_str());
    return n;
  }
}

int CountAttempts(const std::string& dir) {
  int n = 0;
  while (access((dir + "/attempt-" + std::to_string(n)).c_str(), F_OK) == 0) ++n;
  return n;
}

using torus_test::ThisNode;

}  // namespace

int FailBoom(int) { throw std::runtime_error("boom"); }

int FailIdentity(int x) { return x; }

std::string FailWhere() { return ThisNode(); }

// First attempt: records its pid and sleeps (to be killed); later attempts return `value`.
int FailSleepFirstAttempt(std::string dir, int value) {
  if (RecordAttempt(dir) == 0) std::this_thread::sleep_for(std::chrono::seconds(120));
  return value;
}

int FailAbortAlways(std::string dir) {
  RecordAttempt(dir);
  std::abort();
}

// Crashes with SIGSEGV on the first `crashes` attempts, then returns `value`.
int FailSegvTimes(std::string dir, int crashes, int value) {
  if (RecordAttempt(dir) < crashes) raise(SIGSEGV);
  return value;
}

// Records the node that runs it, then sleeps until killed or `sleep_s` passes.
std::string FailWhereSleep(std::string dir, int sleep_s) {
  int n = RecordAttempt(dir);
  {
    std::ofstream out(dir + "/.node-" + std::to_string(n));
    out << ThisNode();
  }
  rename((dir + "/.node-" + std::to_string(n)).c_str(),
         (dir + "/node-" + std::to_string(n)).c_str());
  if (n == 0) std::this_thread::sleep_for(std::chrono::seconds(sleep_s));
  return ThisNode();
}

int FailNotRegistered(int x) { return x; }  // deliberately not in RAY_REMOTE

class FailActor {
 public:
  static FailActor* Create() { return new FailActor(); }
  static FailActor* CreateThrowing() { throw std::runtime_error("constructor boom"); }
  int Echo(int x) {
    if (x < 0) throw std::out_of_range("negative input " + std::to_string(x));
    ++calls_;
    return x;
  }
  int Calls() { return calls_; }
  int NotRegisteredMethod() { return 0; }  // deliberately not in RAY_REMOTE

 private:
  int calls_ = 0;
};

RAY_REMOTE(FailBoom, FailIdentity, FailWhere, FailSleepFirstAttempt, FailAbortAlways, FailSegvTimes,
           FailWhereSleep, FailActor::Create, FailActor::CreateThrowing, &FailActor::Echo,
           &FailActor::Calls);

namespace torus_test {
namespace {

struct FailureTest : ClusterTest<FailureTest> {
  static constexpr const char* kName = "failure";
  static void Build(TestCluster& c) {
    c.StartHead(2);
    NodeSpec s;
    s.num_cpus = 2;
    c.AddNode(s);
  }
};

TEST_F(FailureTest, TaskExceptionCarriesTypeAndMessage) {
  auto ref = ray::Task(FailBoom).Remote(1);
  try {
    ref.Get(kGetTimeoutMs);
    FAIL() << "Get returned for a task that threw";
  } catch (const ray::internal::RayTaskException& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("runtime_error"), std::string::npos) << what;
    EXPECT_NE(what.find("boom"), std::string::npos) << what;
    EXPECT_EQ(e.msg_, what);
  }
}

TEST_F(FailureTest, FailedDependencyFailsTheDependentTask) {
  auto failed = ray::Task(FailBoom).Remote(1);
  auto dependent = ray::Task(FailIdentity).Remote(failed);
  try {
    dependent.Get(kGetTimeoutMs);
    FAIL() << "Get returned for a task whose argument failed";
  } catch (const ray::internal::RayTaskException& e) {
    EXPECT_NE(std::string(e.what()).find("boom"), std::string::npos) << e.what();
  }
}

TEST_F(FailureTest, ActorMethodExceptionAndTheActorKeepsServing) {
  auto actor = ray::Actor(FailActor::Create).Remote();
  EXPECT_EQ(*actor.Task(&FailActor::Echo).Remote(1).Get(kGetTimeoutMs), 1);
  auto bad = actor.Task(&FailActor::Echo).Remote(-5);
  try {
    bad.Get(kGetTimeoutMs);
    FAIL() << "Get returned for a method that threw";
  } catch (const ray::internal::RayTaskException& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("out_of_range"), std::string::npos) << what;
    EXPECT_NE(what.find("negative input -5"), std::string::npos) << what;
  }
  EXPECT_EQ(*actor.Task(&FailActor::Echo).Remote(2).Get(kGetTimeoutMs), 2);
  EXPECT_EQ(*actor.Task(&FailActor::Calls).Remote().Get(kGetTimeoutMs), 2);
}

TEST_F(FailureTest, ActorWhoseConstructorThrows) {
  auto actor = ray::Actor(FailActor::CreateThrowing).Remote();
  try {
    actor.Task(&FailActor::Echo).Remote(1).Get(kGetTimeoutMs);
    FAIL() << "a call on an actor whose constructor threw returned";
  } catch (const ray::internal::RayActorException& e) {
    EXPECT_NE(std::string(e.what()).find("constructor boom"), std::string::npos) << e.what();
  }
}

TEST_F(FailureTest, WorkerSigkilledMidTaskIsRetried) {
  std::string dir = ScratchDir(cluster(), "sigkill");
  auto ref = ray::Task(FailSleepFirstAttempt).Remote(dir, 42);
  ASSERT_TRUE(WaitUntil([&] { return !ReadFileOr(dir + "/pid-0").empty(); }))
      << "the task never started";
  pid_t pid = std::atoi(ReadFileOr(dir + "/pid-0").c_str());
  ASSERT_GT(pid, 0);
  ASSERT_EQ(kill(pid, SIGKILL), 0);
  EXPECT_EQ(*ref.Get(kGetTimeoutMs), 42);
  EXPECT_EQ(CountAttempts(dir), 2);
  EXPECT_NE(ReadFileOr(dir + "/pid-1"), ReadFileOr(dir + "/pid-0"));
}

TEST_F(FailureTest, AbortingTaskFailsAfterItsRetriesSayingTheWorkerDied) {
  std::string dir = ScratchDir(cluster(), "abort");
  auto ref = ray::Task(FailAbortAlways).SetMaxRetries(1).Remote(dir);
  try {
    ref.Get(kGetTimeoutMs);
    FAIL() << "Get returned for a task whose worker always aborts";
  } catch (const ray::internal::RayWorkerException& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("died"), std::string::npos) << what;
    EXPECT_NE(what.find("SIGABRT"), std::string::npos) << what;
  }
  EXPECT_EQ(CountAttempts(dir), 2) << "SetMaxRetries(1): one run and one retry";
}

TEST_F(FailureTest, DefaultMaxRetriesIsThree) {
  std::string dir = ScratchDir(cluster(), "segv3");
  EXPECT_EQ(*ray::Task(FailSegvTimes).Remote(dir, 3, 7).Get(kGetTimeoutMs), 7);
  EXPECT_EQ(CountAttempts(dir), 4);

  std::string dir4 = ScratchDir(cluster(), "segv4");
  EXPECT_THROW(ray::Task(FailSegvTimes).Remote(dir4, 4, 7).Get(kGetTimeoutMs),
               ray::internal::RayWorkerException);
  EXPECT_EQ(CountAttempts(dir4), 4);
}

TEST_F(FailureTest, MaxRetriesMinusOneRetriesWithoutLimit) {
  std::string dir = ScratchDir(cluster(), "segvinf");
  EXPECT_EQ(*ray::Task(FailSegvTimes).SetMaxRetries(-1).Remote(dir, 6, 9).Get(kGetTimeoutMs), 9);
  EXPECT_EQ(CountAttempts(dir), 7);
}

TEST_F(FailureTest, MaxRetriesZeroFailsOnTheFirstCrash) {
  std::string dir = ScratchDir(cluster(), "segv0");
  try {
    ray::Task(FailSegvTimes).SetMaxRetries(0).Remote(dir, 1, 7).Get(kGetTimeoutMs);
    FAIL() << "Get returned for a crashed task with no retries";
  } catch (const ray::internal::RayWorkerException& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("died"), std::string::npos) << what;
    EXPECT_NE(what.find("SIGSEGV"), std::string::npos) << what;
  }
  EXPECT_EQ(CountAttempts(dir), 1);
  // The cluster still runs tasks.
  EXPECT_EQ(*ray::Task(FailIdentity).Remote(3).Get(kGetTimeoutMs), 3);
}

TEST_F(FailureTest, UnregisteredFunctionIsAnErrorAtSubmit) {
  try {
    ray::Task(FailNotRegistered).Remote(1);
    FAIL() << "submitting an unregistered function did not throw";
  } catch (const ray::internal::RayFunctionNotFound& e) {
    EXPECT_NE(std::string(e.what()).find("RAY_REMOTE"), std::string::npos) << e.what();
  }
  auto actor = ray::Actor(FailActor::Create).Remote();
  EXPECT_THROW(actor.Task(&FailActor::NotRegisteredMethod).Remote(),
               ray::internal::RayFunctionNotFound);
}

// Two one-CPU nodes with a "spare" resource, next to the head's node (the driver's), so that a
// task asking for "spare" never runs on the node the driver is attached to.
void AddTwoSpareNodes(TestCluster& c) {
  for (int i = 0; i < 2; ++i) {
    NodeSpec s;
    s.num_cpus = 1;
    s.resources = {{"spare", 1}};
    c.AddNode(s);
  }
}

const NodeInfo* NodeWithId(TestCluster& c, const std::string& id) {
  for (const auto& n : c.nodes()) {
    if (n.node_id == id) return &n;
  }
  return nullptr;
}

// A node that dies (SIGKILL of the node daemon) while running a task: the task is retried on
// another node. The driver joins while the head's node is the only one, so it is attached to that
// node, which has no "spare": the node that dies is never the driver's own.
struct NodeFailureTest : ClusterTest<NodeFailureTest> {
  static constexpr const char* kName = "nodefail";
  static constexpr bool kConnectDriver = false;
  static void Build(TestCluster& c) {
    c.StartHead(1);
    c.ConnectDriver();
    AddTwoSpareNodes(c);
  }
};

// A task leased on a node that is SIGKILLed is retried on another node. (Disabled as a known gap
// until session 4, which found it passing, over the lane and with TORUS_LANE=0 alike.)
TEST_F(NodeFailureTest, TaskOnAKilledNodeIsRetriedElsewhere) {
  std::string dir = ScratchDir(cluster(), "nodekill");
  auto ref = ray::Task(FailWhereSleep).SetResource("spare", 1).Remote(dir, 120);
  ASSERT_TRUE(WaitUntil([&] { return !ReadFileOr(dir + "/node-0").empty(); }));
  std::string first_node = ReadFileOr(dir + "/node-0");
  const NodeInfo* victim = NodeWithId(cluster(), first_node);
  ASSERT_NE(victim, nullptr) << "task ran on unknown node " << first_node;
  cluster().KillNode(*victim);
  std::string second_node = *ref.Get(kGetTimeoutMs);
  EXPECT_NE(second_node, first_node);
  EXPECT_EQ(CountAttempts(dir), 2);
  // The head notices the node is gone.
  EXPECT_TRUE(WaitUntil(
      [&] {
        for (const auto& n : cluster().ListJson("nodes")) {
          if (n.value("node_id", "") == first_node) return n.value("state", "") == "DEAD";
        }
        return false;
      },
      std::chrono::seconds(20)));
}

// Heartbeat pacing: a head allowed 1 heartbeat per second with 2 nodes asks each to beat every
// 2 s, and its death timeout follows the period (5 periods, not --node-timeout-ms 1000 alone):
// the nodes report the paced period, stay alive, and a killed node is still declared dead.
struct PacedHeartbeatTest : ClusterTest<PacedHeartbeatTest> {
  static constexpr const char* kName = "paced";
  static constexpr bool kConnectDriver = false;
  static void Build(TestCluster& c) {
    c.StartHead(1, nlohmann::json::object(), {},
                {"--max-heartbeats-per-s", "1", "--node-timeout-ms", "1000"});
    NodeSpec s;
    s.num_cpus = 1;
    c.AddNode(s);
  }
};

TEST_F(PacedHeartbeatTest, NodesBeatAtThePacedPeriodAndStayAlive) {
  auto states = [&] {
    std::map<std::string, std::pair<std::string, int>> out;  // id -> (state, heartbeat_ms)
    for (const auto& n : cluster().ListJson("nodes")) {
      out[n.value("node_id", "")] = {n.value("state", ""), n.value("heartbeat_ms", 0)};
    }
    return out;
  };
  ASSERT_TRUE(WaitUntil(
      [&] {
        auto st = states();
        if (st.size() != 2) return false;
        for (const auto& [id, s] : st) {
          if (s.second != 2000) return false;
        }
        return true;
      },
      std::chrono::seconds(15)))
      << "nodes do not report the paced 2000 ms period: " << cluster().ListJson("nodes").dump();
  // Silent for up to 2 s between beats, longer than --node-timeout-ms: alive all the same.
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(6);
  while (std::chrono::steady_clock::now() < until) {
    for (const auto& [id, s] : states()) ASSERT_EQ(s.first, "ALIVE") << "node " << id;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  const NodeInfo victim = cluster().nodes().back();
  cluster().KillNode(victim);
  EXPECT_TRUE(WaitUntil([&] { return states()[victim.node_id].first == "DEAD"; },
                        std::chrono::seconds(30)));
  EXPECT_EQ(states()[cluster().head_node().node_id].first, "ALIVE");
}

// The watch ring: a node daemon killed with SIGKILL is declared dead once the node that watches
// it reports its watch link ended and the head's probe goes unanswered, long before heartbeats
// would tell (--node-timeout-ms 60000 here); its task is retried elsewhere, and the head's log
// names the watcher's report as the cause.
struct WatchRingTest : ClusterTest<WatchRingTest> {
  static constexpr const char* kName = "watchring";
  static constexpr bool kConnectDriver = false;
  static void Build(TestCluster& c) {
    c.StartHead(1, nlohmann::json::object(), {}, {"--node-timeout-ms", "60000"});
    c.ConnectDriver();
    AddTwoSpareNodes(c);
  }
};

TEST_F(WatchRingTest, AKilledNodeIsDeclaredDeadWhenItsLinkEnds) {
  std::string dir = ScratchDir(cluster(), "linkkill");
  auto ref = ray::Task(FailWhereSleep).SetResource("spare", 1).Remote(dir, 120);
  ASSERT_TRUE(WaitUntil([&] { return !ReadFileOr(dir + "/node-0").empty(); }));
  const std::string first_node = ReadFileOr(dir + "/node-0");
  const NodeInfo* victim = NodeWithId(cluster(), first_node);
  ASSERT_NE(victim, nullptr) << "task ran on unknown node " << first_node;
  auto state_of = [&](const std::string& id) {
    for (const auto& n : cluster().ListJson("nodes")) {
      if (n.value("node_id", "") == id) return n.value("state", "");
    }
    return std::string();
  };
  const auto t0 = std::chrono::steady_clock::now();
  cluster().KillNode(*victim);
  ASSERT_TRUE(WaitUntil([&] { return state_of(first_node) == "DEAD"; }, std::chrono::seconds(30)));
  // Far inside the 60 s heartbeat timeout: the link, not a heartbeat, told the head.
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  const std::string log = ReadFileOr(cluster().session_dir() + "/logs/head.err");
  EXPECT_NE(log.find("node " + first_node + " declared dead: node "), std::string::npos) << log;
  EXPECT_NE(log.find("reported its watch link to it ended"), std::string::npos) << log;
  EXPECT_NE(log.find("did not answer the head's probe"), std::string::npos) << log;
  EXPECT_NE(*ref.Get(kGetTimeoutMs), first_node);
  for (const auto& n : cluster().nodes()) {
    if (n.node_id != first_node) {
      EXPECT_EQ(state_of(n.node_id), "ALIVE") << n.node_id;
    }
  }
}

// A report about a live node (a flaky link, a confused or hostile watcher) costs one probe and
// kills nothing: the node answers and stays alive.
TEST_F(WatchRingTest, AReportAboutALiveNodeIsCheckedByAProbe) {
  std::map<std::string, std::string> before;  // (a suite run in one process shares its cluster)
  for (const auto& n : cluster().ListJson("nodes")) before[n.value("node_id", "")] = n.value("state", "");
  const NodeInfo& target = cluster().head_node();
  ASSERT_EQ(before[target.node_id], "ALIVE");
  auto channel = grpc::CreateChannel(cluster().address(), grpc::InsecureChannelCredentials());
  auto head = torus::rpc::Head::NewStub(channel);
  torus::rpc::PeerLostRequest req;
  req.set_watcher_id("no-such-watcher");
  req.set_node_id(target.node_id);
  req.set_how("made up by the test");
  torus::rpc::Empty e;
  grpc::ClientContext ctx;
  ctx.AddMetadata("torus-token", cluster().token());
  ASSERT_TRUE(head->ReportPeerLost(&ctx, req, &e).ok());
  const std::string log_path = cluster().session_dir() + "/logs/head.err";
  ASSERT_TRUE(WaitUntil([&] {
    return ReadFileOr(log_path).find("node " + target.node_id + " answered the head's probe: alive") != std::string::npos;
  }));
  for (const auto& n : cluster().ListJson("nodes")) {
    EXPECT_EQ(n.value("state", ""), before[n.value("node_id", "")]) << n.dump();
  }
}

// Views pulled: with --push-view-max-nodes 1 the head ships no cluster view to idle nodes; a
// node with a lease it cannot run asks for one (want_view) and spills the task where it fits.
struct PulledViewTest : ClusterTest<PulledViewTest> {
  static constexpr const char* kName = "pulledview";
  static void Build(TestCluster& c) {
    c.StartHead(1, nlohmann::json::object(), {}, {"--push-view-max-nodes", "1"});
    NodeSpec s;
    s.num_cpus = 1;
    s.resources = {{"far", 1}};
    c.AddNode(s);
  }
};

TEST_F(PulledViewTest, AWaitingLeaseFetchesTheViewAndSpills) {
  auto where = ray::Task(FailWhere).SetResource("far", 1).Remote();
  EXPECT_EQ(*where.Get(kGetTimeoutMs), cluster().nodes().back().node_id);
}

}  // namespace
}  // namespace torus_test
