// Hardening (issue #13): tokens that cannot be empty or short and are compared in constant
// time, ports that are never shared, `torus stop` that signals only its session's daemons, a
// lane whose unauthenticated connections cost no thread, and nodes that give up on a head that
// no longer accepts them (and a head that will not start over live nodes).
#include <arpa/inet.h>
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"
#include "common/lane.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/session.h"
#include "proto/torus.grpc.pb.h"

namespace torus_test {
namespace {

namespace fs = std::filesystem;
namespace rpc = torus::rpc;


// A private directory (0700) under the cluster's tmpdir, for a second session root.
std::string PrivateDir(const TestCluster& c, const std::string& name) {
  std::string dir = c.tmpdir() + "/" + name;
  mkdir(dir.c_str(), 0700);
  return dir;
}

// SIGKILLs every process carrying `marker` in its environment.
void KillAllWith(const std::string& marker) {
  for (pid_t p : ProcessesWithEnv(marker)) kill(p, SIGKILL);
}

int ThreadsOf(pid_t pid) {
  std::string status = ReadFileOr("/proc/" + std::to_string(pid) + "/status");
  auto at = status.find("Threads:");
  return at == std::string::npos ? -1 : std::atoi(status.c_str() + at + 8);
}

// ------------------------------------------------------------------------------- tokens (#2)

TEST(HardeningSecTest, TokenEqualsComparesWholeTokens) {
  const std::string t = "0123456789abcdef0123456789abcdef";
  EXPECT_TRUE(torus::TokenEquals(t, t));
  EXPECT_FALSE(torus::TokenEquals("", t));
  EXPECT_FALSE(torus::TokenEquals(t.substr(0, 31), t));
  EXPECT_FALSE(torus::TokenEquals(t + "0", t));
  EXPECT_FALSE(torus::TokenEquals("1" + t.substr(1), t));
  EXPECT_FALSE(torus::TokenEquals(t.substr(0, 31) + "0", t));
  EXPECT_FALSE(torus::TokenEquals("", "")) << "an empty expected token matches nothing";
}

TEST(HardeningSecTest, EmptyOrShortTokenFileIsRefusedAtStart) {
  TestCluster c("emptytoken");
  c.StartHead(1);
  const std::string session = c.session_dir();
  const std::string address = c.address();
  RunResult stop = c.Torus({"stop"});
  ASSERT_EQ(stop.exit_code, 0) << stop.Describe();
  ASSERT_TRUE(WaitUntil([&] { return c.ClusterProcesses().empty(); }, std::chrono::seconds(10)));

  const std::string token_file = session + "/token";
  for (const std::string& content : {std::string(), std::string("\n"), std::string("abc123")}) {
    SCOPED_TRACE("token file holding '" + content + "'");
    ASSERT_TRUE(torus::WriteFile(token_file, content, 0600).ok());
    // Restarting the head as it ran: refused at once, naming the file and what is wrong.
    RunResult head = c.Torus({"head", "--port", std::to_string(FreePort()), "--session-dir", session}, {}, {}, 15);
    EXPECT_FALSE(head.timed_out) << "the head started with a token file holding '" << content << "'";
    EXPECT_EQ(head.exit_code, 1) << head.Describe();
    EXPECT_TRUE(Contains(head.err, token_file)) << head.Describe();
    EXPECT_TRUE(Contains(head.err, content.size() > 1 ? "too short" : "empty")) << head.Describe();
    RunResult node = c.Torus({"node", "--address", address, "--session-dir", session}, {}, {}, 15);
    EXPECT_FALSE(node.timed_out);
    EXPECT_EQ(node.exit_code, 1) << node.Describe();
    EXPECT_TRUE(Contains(node.err, token_file)) << node.Describe();
  }
  // A short TORUS_TOKEN is refused too, and nothing is left running.
  RunResult start = c.Torus({"start", "--head", "--port", std::to_string(FreePort())}, {{"TORUS_TOKEN", "short"}},
                            {}, 30);
  EXPECT_NE(start.exit_code, 0) << start.Describe();
  EXPECT_TRUE(Contains(start.err, "TORUS_TOKEN")) << start.Describe();
  EXPECT_TRUE(WaitUntil([&] { return c.ClusterProcesses().empty(); }, std::chrono::seconds(10)));
  for (pid_t p : c.ClusterProcesses()) ADD_FAILURE() << "left running: " << DescribeProcess(p);
  KillAllWith(c.EnvMarker());
}

// ------------------------------------------------------------------------------- ports (#3)

TEST(HardeningSecTest, PortHeldByAnotherHeadOrNodeIsRefusedNotShared) {
  TestCluster c("portshare");
  c.StartHead(1);
  const std::string port = std::to_string(PortOf(c.address()));
  // A second cluster (another session root) asking for the first head's port.
  const std::string other = PrivateDir(c, "other-root");
  RunResult r = c.Torus({"start", "--head", "--port", port, "--num-cpus", "1"}, {{"TORUS_TMPDIR", other}}, {}, 40);
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "address already in use")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, port)) << r.Describe();
  EXPECT_TRUE(WaitUntil([&] { return ProcessesWithEnv("TORUS_TMPDIR=" + other).empty(); }, std::chrono::seconds(5)));
  for (pid_t p : ProcessesWithEnv("TORUS_TMPDIR=" + other)) ADD_FAILURE() << "left running: " << DescribeProcess(p);
  KillAllWith("TORUS_TMPDIR=" + other);

  // A node asking for a port in use (the head's node's).
  const std::string node_port = std::to_string(PortOf(c.head_node().address));
  RunResult n = c.Torus({"node", "--address", c.address(), "--node-port", node_port, "--session-dir",
                         c.session_dir()}, {}, {}, 20);
  EXPECT_FALSE(n.timed_out) << "a second node bound port " << node_port << " too";
  EXPECT_NE(n.exit_code, 0) << n.Describe();
  EXPECT_TRUE(Contains(n.err, "address already in use")) << n.Describe();
  EXPECT_TRUE(Contains(n.err, node_port)) << n.Describe();

  // The first cluster is untouched: one alive node, the head's.
  EXPECT_EQ(AliveNodeIds(c), std::set<std::string>{c.head_node().node_id});
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
}

// ------------------------------------------------------------------------------- stop (#4)

TEST(HardeningSecTest, PidFilesHoldingNonsenseAreRefused) {
  for (const char* bad : {"-1", "0", "1", "abc", "", "12 34 56", "12abc", "99999999999999999999"}) {
    EXPECT_FALSE(torus::ParsePidFile(bad).ok()) << "'" << bad << "'";
  }
  auto r = torus::ParsePidFile("1234 5678\n");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->pid, 1234);
  EXPECT_EQ(r->start_time, 5678u);
  r = torus::ParsePidFile("4321");  // older pid files: no start time
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->start_time, 0u);
}

TEST(HardeningSecTest, StopSignalsOnlyTheSessionsOwnDaemons) {
  TestCluster c("stopplanted");
  c.StartHead(1);
  const std::string pids = c.session_dir() + "/pids/";
  // An unrelated process, and a pid file naming it.
  pid_t sleeper = SpawnProcess({"/bin/sleep", "600"}, {}, {"TORUS_TMPDIR"}, "/dev/null", "/dev/null");
  ASSERT_TRUE(torus::WriteFile(pids + "planted.pid", std::to_string(sleeper) + "\n").ok());
  // Same pid, with the sleeper's real start time: still not a daemon of this session.
  ASSERT_TRUE(torus::WriteFile(pids + "planted2.pid", torus::PidFileContent(sleeper)).ok());
  // A stale file (its process is gone) and garbage.
  pid_t gone = SpawnProcess({"/bin/true"}, {}, {}, "/dev/null", "/dev/null");
  int status;
  waitpid(gone, &status, 0);
  ASSERT_TRUE(torus::WriteFile(pids + "stale.pid", torus::PidFileContent(gone) + "").ok());
  ASSERT_TRUE(torus::WriteFile(pids + "garbage.pid", "not a pid").ok());

  RunResult stop = c.Torus({"stop"});
  EXPECT_EQ(stop.exit_code, 0) << stop.Describe();
  EXPECT_TRUE(Contains(stop.out, "Stopped 2 Torus process")) << "head and its node\n" << stop.Describe();
  EXPECT_TRUE(Contains(stop.err, "planted.pid")) << stop.Describe();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_TRUE(ProcessRunning(sleeper)) << "torus stop signalled an unrelated process named by a pid file";
  kill(sleeper, SIGKILL);
  waitpid(sleeper, &status, 0);
  EXPECT_TRUE(WaitUntil([&] { return c.ClusterProcesses().empty(); }, std::chrono::seconds(10)));
  std::vector<std::string> left;
  for (const auto& f : fs::directory_iterator(pids)) left.push_back(f.path().filename().string());
  EXPECT_TRUE(left.empty()) << "pid files left: " << testing::PrintToString(left);
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
}

TEST(HardeningSecTest, SessionRootOpenToOthersIsRefused) {
  TestCluster c("rootperms");
  // A fresh root is created private.
  const std::string fresh = c.tmpdir() + "/fresh-root";
  setenv("TORUS_TMPDIR", fresh.c_str(), 1);
  auto s = torus::CreateSession(true);
  setenv("TORUS_TMPDIR", c.tmpdir().c_str(), 1);
  ASSERT_TRUE(s.ok()) << s.status().message();
  struct stat st;
  ASSERT_EQ(stat(fresh.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0700u);

  // A root others may write to: start and stop refuse it, naming it.
  const std::string open_root = PrivateDir(c, "open-root");
  chmod(open_root.c_str(), 0777);
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"start", "--head", "--port", std::to_string(FreePort())}, {"stop"}}) {
    RunResult r = c.Torus(args, {{"TORUS_TMPDIR", open_root}}, {}, 30);
    EXPECT_NE(r.exit_code, 0) << r.Describe();
    EXPECT_TRUE(Contains(r.err, open_root) && Contains(r.err, "writable by other users")) << r.Describe();
  }
  EXPECT_TRUE(ProcessesWithEnv("TORUS_TMPDIR=" + open_root).empty());
  KillAllWith("TORUS_TMPDIR=" + open_root);

  // A session_latest link to a session others may write to: refused.
  c.StartHead(1);
  chmod(c.session_dir().c_str(), 0777);
  RunResult status = c.Torus({"status"});
  EXPECT_NE(status.exit_code, 0) << status.Describe();
  EXPECT_TRUE(Contains(status.err, "writable by other users")) << status.Describe();
  chmod(c.session_dir().c_str(), 0700);
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
}

// ------------------------------------------------------------------------------- lane (#8)

int LanePort(const std::string& address, const std::string& token) {
  auto ch = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  auto stub = rpc::Lane::NewStub(ch);
  auto ctx = torus::NewContext(token, 5000);
  rpc::LaneWhereReply reply;
  return stub->Where(ctx.get(), rpc::Empty(), &reply).ok() ? static_cast<int>(reply.port()) : 0;
}

// A non-blocking connect to 127.0.0.1:port; the fd, or -1.
int ConnectIdle(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 && errno != EINPROGRESS) {
    close(fd);
    return -1;
  }
  return fd;
}

// True once the peer closed `fd` (EOF or reset).
bool ClosedByPeer(int fd) {
  char b;
  ssize_t k = recv(fd, &b, 1, MSG_DONTWAIT);
  return k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINPROGRESS);
}

TEST(HardeningSecTest, IdleConnectionsToTheLaneCostNoThreads) {
  TestCluster c("laneidle");
  c.StartHead(1);
  const std::string token = c.token();
  const int lane_port = LanePort(c.address(), token);
  ASSERT_GT(lane_port, 0);
  rlimit lim{};
  getrlimit(RLIMIT_NOFILE, &lim);
  lim.rlim_cur = std::min<rlim_t>(lim.rlim_max, 8192);
  setrlimit(RLIMIT_NOFILE, &lim);
  ASSERT_GE(lim.rlim_cur, 2200u) << "this test needs 2,200 file descriptors";

  const pid_t head = c.head_pid();
  const int before = ThreadsOf(head);
  ASSERT_GT(before, 0);
  constexpr int kIdle = 2000;
  std::vector<int> fds;
  int peak = before;
  for (int i = 0; i < kIdle; ++i) {
    int fd = ConnectIdle(lane_port);
    if (fd >= 0) fds.push_back(fd);
    if (i % 100 == 0) peak = std::max(peak, ThreadsOf(head));
  }
  EXPECT_GE(fds.size(), static_cast<size_t>(kIdle * 9 / 10));
  // While they are open, a legitimate client is served on the lane.
  std::vector<torus::LaneRequest> reqs(1);
  rpc::PlacementGroupRequest pg;
  pg.set_pg_id("no-such-group");
  reqs[0] = {c.address(), "/torus.rpc.Head/GetPlacementGroup", pg.SerializeAsString()};
  ASSERT_TRUE(torus::HasLane(c.address(), token));
  auto t0 = std::chrono::steady_clock::now();
  auto res = torus::LaneCallMany(token, reqs, 5000);
  auto served_ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_TRUE(res[0].delivered);
  EXPECT_TRUE(res[0].status.ok()) << res[0].status.error_message();
  // The server closes every idle connection within its hello deadline (2 s) or sooner. A
  // connection whose SYN found the accept queue full waits for the client's SYN retry (after
  // 1 s, 3 s, 7 s) before the 2 s start, so the wait allows for two retries.
  size_t closed = 0;
  WaitUntil([&] {
    peak = std::max(peak, ThreadsOf(head));
    closed = 0;
    for (int fd : fds) closed += ClosedByPeer(fd);
    return closed == fds.size();
  }, std::chrono::seconds(12));
  for (int fd : fds) close(fd);
  std::printf("head threads: %d before, peak %d with %zu idle lane connections; %zu closed by the head; "
              "a lane call served in %lld ms meanwhile\n",
              before, peak, fds.size(), closed, static_cast<long long>(served_ms));
  EXPECT_LE(peak, before + 32) << "idle unauthenticated connections held threads in the head";
  EXPECT_EQ(closed, fds.size()) << "idle connections still open after 12 s";
  EXPECT_TRUE(ProcessRunning(head));
  EXPECT_NO_THROW(c.Status());
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
}

// ------------------------------------------------------------------------------- head restart (#9)

TEST(HardeningSecTest, StartHeadRefusesWhileTheLastSessionsNodesLive) {
  TestCluster c("restarthead");
  c.StartHead(1);
  const std::string port = std::to_string(PortOf(c.address()));
  const std::string latest = c.session_dir();
  ASSERT_EQ(kill(c.head_pid(), SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] { return !ProcessRunning(c.head_pid()); }, std::chrono::seconds(5)));
  RunResult r = c.Torus({"start", "--head", "--port", port, "--num-cpus", "1"}, {}, {}, 40);
  EXPECT_NE(r.exit_code, 0) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "still running")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "node-head")) << r.Describe();
  EXPECT_TRUE(Contains(r.err, "torus stop")) << r.Describe();
  EXPECT_TRUE(ProcessRunning(c.head_node().pid)) << "the old node should be left to `torus stop`";
  std::error_code ec;
  EXPECT_EQ(fs::canonical(c.tmpdir() + "/session_latest", ec).string(), latest) << "session_latest moved";
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
}

TEST(HardeningSecTest, NodesGiveUpOnAHeadThatRefusesTheirToken) {
  TestCluster c("giveup");
  setenv("TORUS_NODE_HEAD_LOST_MS", "3000", 1);  // inherited by the nodes `torus start` spawns
  c.StartHead(1);
  NodeSpec spec;
  NodeInfo extra = c.AddNode(spec);
  unsetenv("TORUS_NODE_HEAD_LOST_MS");
  RunResult job = c.Torus({"job", "submit", "--no-wait", "--", "/bin/sleep", "600"});
  ASSERT_EQ(job.exit_code, 0) << job.Describe();
  auto job_processes = [&] {
    int n = 0;
    for (pid_t p : c.ClusterProcesses()) n += Contains(DescribeProcess(p), "sleep 600");
    return n;
  };
  ASSERT_TRUE(WaitUntil([&] { return job_processes() == 1; })) << "the job process did not start";

  // The head dies; another head (a new session: another token) takes its port.
  const int port = PortOf(c.address());
  ASSERT_EQ(kill(c.head_pid(), SIGKILL), 0);
  ASSERT_TRUE(WaitUntil([&] { return !ProcessRunning(c.head_pid()); }, std::chrono::seconds(5)));
  const std::string other = PrivateDir(c, "new-root");
  const std::string new_session = PrivateDir(c, "new-root/session_new");
  mkdir((new_session + "/logs").c_str(), 0700);
  ASSERT_TRUE(torus::WriteFile(new_session + "/token", "fedcba9876543210fedcba9876543210", 0600).ok());
  pid_t impostor = 0;
  ASSERT_TRUE(WaitUntil([&] {  // the port may linger a moment after the kill
    if (impostor > 0 && ProcessRunning(impostor)) return fs::exists(new_session + "/head_address");
    impostor = SpawnProcess({TORUS_BIN, "head", "--port", std::to_string(port), "--session-dir", new_session},
                            {{"TORUS_TMPDIR", other}}, {}, other + "/head.out", other + "/head.err");
    return false;
  }, std::chrono::seconds(15))) << ReadFileOr(other + "/head.err");

  // Both nodes give up within their 3 s (plus a heartbeat or two), with their job process.
  bool all_gone = WaitUntil([&] { return c.ClusterProcesses().empty(); }, std::chrono::seconds(25));
  for (pid_t p : c.ClusterProcesses()) ADD_FAILURE() << "still running: " << DescribeProcess(p);
  EXPECT_TRUE(all_gone);
  std::string log = ReadFileOr(c.session_dir() + "/logs/node-head.err");
  EXPECT_TRUE(Contains(log, "giving up") && Contains(log, "token")) << log;
  for (const auto& n : {c.head_node(), extra}) {
    EXPECT_TRUE(ShmSegments("torus." + n.node_id.substr(0, 12) + ".").empty())
        << "node " << n.node_id << " left its shared memory";
  }
  kill(impostor, SIGKILL);
  int status;
  waitpid(impostor, &status, 0);
  for (const auto& l : c.Stop()) ADD_FAILURE() << l;
}

}  // namespace
}  // namespace torus_test
