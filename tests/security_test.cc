// Every port requires the cluster token, listens on loopback by default, and survives garbage:
// random bytes, truncated or malformed HTTP/2, wrong or missing tokens, and well-authenticated
// requests with nonsense in them. Afterwards every daemon is still alive and the cluster serves.
#include <arpa/inet.h>
#include <dirent.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <ray/api.h>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cluster_fixture.h"
#include "proto/torus.grpc.pb.h"
#include "raw_rpc.h"

int SecPlus(int a, int b) { return a + b; }

int SecPid() { return static_cast<int>(getpid()); }

class SecActor {
 public:
  static SecActor* Create() { return new SecActor(); }
  int Pid() { return static_cast<int>(getpid()); }
  int Inc() { return ++n_; }

 private:
  int n_ = 0;
};

RAY_REMOTE(SecPlus, SecPid, SecActor::Create, &SecActor::Pid, &SecActor::Inc);

// A driver that only connects (address from TORUS_ADDRESS): prints "connected", or the error.
TORUS_TEST_CHILD_SCENARIO(connect_only) {
  try {
    ray::Init();
  } catch (const std::exception& e) {
    std::printf("init failed: %s\n", e.what());
    return 4;
  }
  std::printf("connected\n");
  ray::Shutdown();
  return 0;
}

namespace torus_test {
namespace {

namespace rpc = torus::rpc;

struct Endpoint {
  std::string what;     // "head", "node <id>", "worker <id>", "driver"
  std::string address;  // host:port
};

// A client context with the given token (none when `token` is null) and a deadline.
std::unique_ptr<grpc::ClientContext> Context(const char* token, int deadline_ms = 5000) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  if (token) ctx->AddMetadata("torus-token", token);
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  return ctx;
}

int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Sends `bytes`, then reads until the peer closes the connection or `timeout` passes. Returns
// true when the peer closed it (EOF or reset).
bool SendAndExpectClose(int port, const std::string& bytes, std::chrono::milliseconds timeout) {
  int fd = Connect(port);
  if (fd < 0) return false;
  size_t off = 0;
  while (off < bytes.size()) {
    ssize_t n = send(fd, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      return true;  // the peer already closed (EPIPE / ECONNRESET)
    }
    off += static_cast<size_t>(n);
  }
  auto deadline = std::chrono::steady_clock::now() + timeout;
  char buf[4096];
  bool closed = false;
  while (std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 100) <= 0) continue;
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) {
      closed = true;
      break;
    }
  }
  close(fd);
  return closed;
}

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng());
  return s;
}

// Listening TCP sockets of `pids`: port -> local address (hex, as in /proc/net/tcp).
std::map<int, std::string> ListeningSockets(const std::vector<pid_t>& pids) {
  std::set<std::string> inodes;
  for (pid_t pid : pids) {
    std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    DIR* d = opendir(dir.c_str());
    if (!d) continue;
    while (dirent* e = readdir(d)) {
      char target[256];
      ssize_t n = readlink((dir + "/" + e->d_name).c_str(), target, sizeof target - 1);
      if (n <= 0) continue;
      target[n] = 0;
      if (strncmp(target, "socket:[", 8) == 0) {
        inodes.insert(std::string(target + 8, strlen(target) - 9));
      }
    }
    closedir(d);
  }
  std::map<int, std::string> out;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::istringstream in(ReadFileOr(table));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, tr, retrnsmt, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> tr >> retrnsmt >> uid >> timeout >> inode;
      if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
      auto colon = local.rfind(':');
      int port = static_cast<int>(std::stoul(local.substr(colon + 1), nullptr, 16));
      out[port] = local.substr(0, colon);
    }
  }
  return out;
}

struct SecurityTest : ClusterTest<SecurityTest> {
  static constexpr const char* kName = "security";
  static void Build(TestCluster& c) {
    c.StartHead(2, {{"head_res", 10}});
    NodeSpec s;
    s.num_cpus = 2;
    s.resources = {{"other", 10}};
    c.AddNode(s);
  }

 protected:
  void SetUp() override {
    ClusterTest::SetUp();
    // Workers on both nodes, one of them an actor.
    actor_ = ray::Actor(SecActor::Create).SetResource("other", 1).Remote();
    ASSERT_EQ(*actor_.Task(&SecActor::Inc).Remote().Get(kGetTimeoutMs), 1);
    ASSERT_EQ(*ray::Task(SecPlus).SetResource("head_res", 1).Remote(1, 2).Get(kGetTimeoutMs), 3);
    ASSERT_EQ(*ray::Task(SecPlus).SetResource("other", 1).Remote(1, 2).Get(kGetTimeoutMs), 3);
  }

  // Head, nodes, workers (addresses from the node's Info RPC: `torus list workers` does not
  // show them) and this driver's own core worker (its address is in every object id).
  std::vector<Endpoint> Endpoints() {
    std::vector<Endpoint> eps = {{"head", cluster().address()}};
    std::string token = cluster().token();
    for (const auto& n : cluster().ListJson("nodes")) {
      if (n.value("state", "") != "ALIVE") continue;
      std::string addr = n.value("address", "");
      eps.push_back({"node " + n.value("node_id", ""), addr});
      auto stub = rpc::Node::NewStub(Channel(addr));
      rpc::NodeInfoReply info;
      auto ctx = Context(token.c_str());
      if (!stub->Info(ctx.get(), rpc::Empty(), &info).ok()) continue;
      for (const auto& w : info.workers()) {
        if (!w.address().empty()) eps.push_back({"worker " + w.worker_id(), w.address()});
      }
    }
    std::string id = ray::Put(1).ID();
    eps.push_back({"driver", id.substr(id.find('@') + 1)});
    return eps;
  }

  // pid of every daemon and worker of the cluster.
  std::vector<pid_t> DaemonPids() {
    std::vector<pid_t> pids = {cluster().head_pid()};
    for (const auto& n : cluster().nodes()) pids.push_back(n.pid);
    for (const auto& w : cluster().ListJson("workers")) pids.push_back(w.value("pid", 0));
    return pids;
  }

  void ExpectClusterServes(const std::vector<pid_t>& pids) {
    for (pid_t p : pids) EXPECT_TRUE(ProcessRunning(p)) << DescribeProcess(p) << " died";
    EXPECT_EQ(*actor_.Task(&SecActor::Inc).Remote().Get(kGetTimeoutMs), 2);
    EXPECT_EQ(*ray::Task(SecPlus).SetResource("head_res", 1).Remote(2, 3).Get(kGetTimeoutMs), 5);
    EXPECT_EQ(*ray::Task(SecPlus).SetResource("other", 1).Remote(2, 3).Get(kGetTimeoutMs), 5);
    EXPECT_NO_THROW(cluster().Status());
    EXPECT_EQ(AliveNodeIds(cluster()).size(), cluster().nodes().size());
  }

  ray::ActorHandle<SecActor> actor_;
};

TEST_F(SecurityTest, EveryPortListensOnLoopbackOnly) {
  std::map<int, std::string> listening = ListeningSockets(cluster().ClusterProcesses());
  ASSERT_FALSE(listening.empty());
  // 127.0.0.1 in /proc/net/tcp, or ::ffff:127.0.0.1 / ::1 in /proc/net/tcp6.
  const std::set<std::string> loopback = {"0100007F", "0000000000000000FFFF00000100007F",
                                          "00000000000000000000000001000000"};
  for (const auto& [port, local] : listening) {
    EXPECT_TRUE(loopback.count(local)) << "port " << port << " is bound to " << local
                                       << " (hex, as in /proc/net/tcp*), not to loopback";
  }
  for (const auto& ep : Endpoints()) {
    if (ep.what == "driver") continue;  // this process, not a cluster process
    EXPECT_TRUE(listening.count(PortOf(ep.address))) << ep.what << " at " << ep.address;
  }
}

TEST_F(SecurityTest, GarbageOnEveryPortIsRefusedAndTheClusterStillServes) {
  std::vector<pid_t> pids = DaemonPids();
  std::set<int> ports;
  std::vector<Endpoint> eps = Endpoints();
  for (const auto& ep : eps) ports.insert(PortOf(ep.address));
  for (const auto& [port, local] : ListeningSockets(cluster().ClusterProcesses())) ports.insert(port);
  ASSERT_GE(ports.size(), 5u) << "head, 2 nodes, at least 2 workers";

  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  uint32_t seed = 1;
  for (int port : ports) {
    SCOPED_TRACE("port " + std::to_string(port));
    // Random bytes: not HTTP/2, the connection is dropped.
    EXPECT_TRUE(SendAndExpectClose(port, RandomBytes(64 << 10, seed++), std::chrono::seconds(10)))
        << "random bytes: the server kept the connection open";
    // HTTP/1.1.
    EXPECT_TRUE(SendAndExpectClose(port, "GET / HTTP/1.1\r\nHost: x\r\n\r\n", std::chrono::seconds(10)));
    // A valid preface followed by garbage frames.
    EXPECT_TRUE(SendAndExpectClose(port, preface + RandomBytes(4096, seed++), std::chrono::seconds(10)))
        << "preface + garbage: the server kept the connection open";
    // A truncated preface, then we hang up.
    int fd = Connect(port);
    ASSERT_GE(fd, 0);
    std::string partial = preface.substr(0, 10);
    EXPECT_GT(send(fd, partial.data(), partial.size(), MSG_NOSIGNAL), 0);
    close(fd);
    // A frame header announcing 16 MiB, then nothing.
    std::string huge = preface + std::string("\xff\xff\xff\x00\x00\x00\x00\x00\x01", 9);
    fd = Connect(port);
    ASSERT_GE(fd, 0);
    EXPECT_GT(send(fd, huge.data(), huge.size(), MSG_NOSIGNAL), 0);
    close(fd);
    // Many idle connections at once.
    std::vector<int> fds;
    for (int i = 0; i < 64; ++i) {
      int c = Connect(port);
      if (c >= 0) fds.push_back(c);
    }
    for (int c : fds) close(c);
  }
  ExpectClusterServes(pids);
}

TEST_F(SecurityTest, WrongOrMissingTokenIsRefused) {
  std::vector<pid_t> pids = DaemonPids();
  const char* wrong = "0123456789abcdef0123456789abcdef";
  for (const char* token : {wrong, static_cast<const char*>(nullptr)}) {
    SCOPED_TRACE(token ? "wrong token" : "no token");
    {
      auto stub = rpc::Head::NewStub(Channel(cluster().address()));
      rpc::ListReply reply;
      auto ctx = Context(token);
      grpc::Status st = stub->List(ctx.get(), rpc::Empty(), &reply);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
      EXPECT_NE(st.error_message().find("token"), std::string::npos) << st.error_message();
      EXPECT_EQ(reply.nodes_size(), 0);

      rpc::KillActorRequest kill;
      kill.set_actor_id(actor_.ID());
      kill.set_no_restart(true);
      rpc::Empty e;
      auto kctx = Context(token);
      st = stub->KillActor(kctx.get(), kill, &e);
      EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
    }
    for (const auto& ep : Endpoints()) {
      SCOPED_TRACE(ep.what);
      if (ep.what.rfind("node", 0) == 0) {
        auto stub = rpc::Node::NewStub(Channel(ep.address));
        rpc::NodeInfoReply info;
        auto ctx = Context(token);
        grpc::Status st = stub->Info(ctx.get(), rpc::Empty(), &info);
        EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
        EXPECT_NE(st.error_message().find("token"), std::string::npos) << st.error_message();
        rpc::LeaseRequest lease;
        (*lease.mutable_resources()->mutable_units())["CPU"] = kUnits;
        rpc::LeaseReply lreply;
        auto lctx = Context(token);
        st = stub->RequestLease(lctx.get(), lease, &lreply);
        EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
        EXPECT_FALSE(lreply.granted());
      } else if (ep.what != "head") {
        auto stub = rpc::CoreWorker::NewStub(Channel(ep.address));
        rpc::GetObjectRequest req;
        req.set_object_id("00@" + ep.address);
        req.set_timeout_ms(0);
        rpc::GetObjectReply reply;
        auto ctx = Context(token);
        grpc::Status st = stub->GetObject(ctx.get(), req, &reply);
        EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
        EXPECT_NE(st.error_message().find("token"), std::string::npos) << st.error_message();
        rpc::Empty e;
        auto xctx = Context(token);
        st = stub->Exit(xctx.get(), rpc::Empty(), &e);
        EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
      }
    }
  }
  ExpectClusterServes(pids);
}

TEST_F(SecurityTest, ClientsWithTheWrongTokenFailWithAClearMessage) {
  RunResult status = cluster().Torus({"status"}, {{"TORUS_TOKEN", "not-the-token"}});
  EXPECT_NE(status.exit_code, 0) << status.Describe();
  EXPECT_NE(status.err.find("token"), std::string::npos) << status.Describe();

  RunResult driver = RunChild("connect_only", {{"TORUS_ADDRESS", cluster().address()},
                                               {"TORUS_TOKEN", "not-the-token"}});
  EXPECT_EQ(driver.exit_code, 4) << driver.Describe();
  EXPECT_NE(driver.out.find("token"), std::string::npos) << driver.Describe();

  // With the right token from the environment (no session to read it from) it connects.
  RunResult ok = RunChild("connect_only", {{"TORUS_ADDRESS", cluster().address()},
                                           {"TORUS_TOKEN", cluster().token()},
                                           {"TORUS_TMPDIR", cluster().tmpdir() + "/nowhere"}});
  EXPECT_EQ(ok.exit_code, 0) << ok.Describe();
  // Without any token (no TORUS_TOKEN, no session under TORUS_TMPDIR): a clear refusal.
  RunResult none = RunChild("connect_only", {{"TORUS_ADDRESS", cluster().address()},
                                             {"TORUS_TMPDIR", cluster().tmpdir() + "/nowhere"}},
                            {"TORUS_TOKEN"});
  EXPECT_EQ(none.exit_code, 4) << none.Describe();
  EXPECT_NE(none.out.find("token"), std::string::npos) << none.Describe();
}

TEST_F(SecurityTest, TokenFileIsPrivate) {
  struct stat st;
  ASSERT_EQ(stat((cluster().session_dir() + "/token").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(cluster().session_dir().c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u) << "the session directory is open to other users";
  EXPECT_GE(cluster().token().size(), 16u);
}

TEST_F(SecurityTest, AuthenticatedNonsenseIsAnsweredNotFatal) {
  std::vector<pid_t> pids = DaemonPids();
  std::string token = cluster().token();
  auto head = rpc::Head::NewStub(Channel(cluster().address()));
  {
    rpc::GetActorRequest req;
    req.set_actor_id("no-such-actor");
    rpc::GetActorReply reply;
    auto ctx = Context(token.c_str());
    EXPECT_TRUE(head->GetActor(ctx.get(), req, &reply).ok());
    EXPECT_FALSE(reply.found());
  }
  {
    rpc::KillActorRequest req;
    req.set_actor_id(std::string(1000, 'x'));
    rpc::Empty e;
    auto ctx = Context(token.c_str());
    EXPECT_TRUE(head->KillActor(ctx.get(), req, &e).ok());
  }
  {
    rpc::RegisterNodeRequest req;  // no node id, no address
    rpc::RegisterNodeReply reply;
    auto ctx = Context(token.c_str());
    grpc::Status st = head->RegisterNode(ctx.get(), req, &reply);
    EXPECT_TRUE(!st.ok() || (reply.has_error() && reply.error().code() != 0))
        << "an empty node registration was accepted";
  }
  {
    rpc::CreateActorRequest req;  // no actor id
    rpc::CreateActorReply reply;
    auto ctx = Context(token.c_str());
    grpc::Status st = head->CreateActor(ctx.get(), req, &reply);
    EXPECT_TRUE(!st.ok() || (reply.has_error() && reply.error().code() != 0));
  }
  for (const auto& ep : Endpoints()) {
    SCOPED_TRACE(ep.what);
    if (ep.what.rfind("node", 0) == 0) {
      auto node = rpc::Node::NewStub(Channel(ep.address));
      rpc::Empty e;
      rpc::KillWorkerRequest kill;
      kill.set_worker_id("no-such-worker");
      auto c1 = Context(token.c_str());
      EXPECT_TRUE(node->KillWorker(c1.get(), kill, &e).ok());
      rpc::ReturnLeaseRequest ret;
      ret.set_lease_id("no-such-lease");
      auto c2 = Context(token.c_str());
      EXPECT_TRUE(node->ReturnLease(c2.get(), ret, &e).ok());
      rpc::WorkerExitRequest exit_req;
      exit_req.set_worker_id("no-such-worker");
      rpc::WorkerExitReply exit_reply;
      auto c3 = Context(token.c_str());
      EXPECT_TRUE(node->GetWorkerExit(c3.get(), exit_req, &exit_reply).ok());
      EXPECT_FALSE(exit_reply.exited());
      rpc::RegisterWorkerRequest reg;
      reg.set_worker_id("not-started-by-this-node");
      reg.set_address("127.0.0.1:1");
      rpc::RegisterWorkerReply reg_reply;
      auto c4 = Context(token.c_str());
      EXPECT_FALSE(node->RegisterWorker(c4.get(), reg, &reg_reply).ok());
      // A lease no node could grant: it waits until the caller gives up, then is dropped.
      rpc::LeaseRequest lease;
      (*lease.mutable_resources()->mutable_units())["CPU"] = 1000000 * kUnits;
      rpc::LeaseReply lreply;
      auto c5 = Context(token.c_str(), 300);
      grpc::Status st = node->RequestLease(c5.get(), lease, &lreply);
      EXPECT_FALSE(lreply.granted()) << st.error_message();
    } else if (ep.what.rfind("worker", 0) == 0 || ep.what == "driver") {
      auto worker = rpc::CoreWorker::NewStub(Channel(ep.address));
      rpc::GetObjectRequest req;
      req.set_object_id("not-an-object-id");
      req.set_timeout_ms(0);
      rpc::GetObjectReply reply;
      auto ctx = Context(token.c_str());
      grpc::Status st = worker->GetObject(ctx.get(), req, &reply);
      EXPECT_TRUE(st.ok()) << st.error_message();
      EXPECT_TRUE(!reply.ready() || reply.is_error());
    }
  }
  ExpectClusterServes(pids);
}

// The lane (src/common/lane.h, docs/wire.md), spoken from outside with hand-made frames: the
// token is checked at the hello, garbage and unknown methods are refused, and a real call is
// answered exactly as over gRPC.
namespace {
struct Frame {
  uint16_t code = 0;
  std::string text, payload;
};

std::string MakeFrame(uint8_t kind, const std::string& text, const std::string& payload) {
  std::string f(16, '\0');
  uint32_t magic = 0x314e4c54, tl = static_cast<uint32_t>(text.size()),
           pl = static_cast<uint32_t>(payload.size());
  memcpy(&f[0], &magic, 4);
  f[4] = static_cast<char>(kind);
  memcpy(&f[8], &tl, 4);
  memcpy(&f[12], &pl, 4);
  return f + text + payload;
}

bool SendAll(int fd, const std::string& bytes) {
  return send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(bytes.size());
}

bool RecvAll(int fd, char* buf, size_t n) {
  size_t got = 0;
  while (got < n) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 10000) <= 0) return false;
    ssize_t k = recv(fd, buf + got, n - got, 0);
    if (k <= 0) return false;
    got += static_cast<size_t>(k);
  }
  return true;
}

// Reads one reply frame; false if the connection closed (or nothing came in 10 s).
bool ReadReply(int fd, Frame* out) {
  char h[16];
  if (!RecvAll(fd, h, 16)) return false;
  uint32_t magic, tl, pl;
  memcpy(&magic, h, 4);
  memcpy(&out->code, h + 6, 2);
  memcpy(&tl, h + 8, 4);
  memcpy(&pl, h + 12, 4);
  if (magic != 0x314e4c54 || h[4] != 3) return false;
  out->text.assign(tl, '\0');
  out->payload.assign(pl, '\0');
  return (tl == 0 || RecvAll(fd, out->text.data(), tl)) && (pl == 0 || RecvAll(fd, out->payload.data(), pl));
}

// Connects to a lane and says hello with `token`: the connection, or -1 with *why set.
int HelloLane(int port, const std::string& token, std::string* why) {
  int fd = Connect(port);
  Frame f;
  if (fd < 0) {
    *why = "cannot connect";
  } else if (!SendAll(fd, MakeFrame(1, token, "")) || !ReadReply(fd, &f)) {
    *why = "no reply to the hello";
  } else if (f.code != 0) {
    *why = "hello refused: " + f.text;
  } else {
    return fd;
  }
  if (fd >= 0) close(fd);
  return -1;
}

int LanePort(const std::string& address, const char* token, grpc::Status* st) {
  rpc::Lane::Stub stub(Channel(address));
  rpc::LaneWhereReply reply;
  auto ctx = Context(token);
  *st = stub.Where(ctx.get(), rpc::Empty(), &reply);
  return static_cast<int>(reply.port());
}
}  // namespace

TEST_F(SecurityTest, LaneChecksTheTokenRefusesGarbageAndAnswersCalls) {
  std::vector<pid_t> pids = DaemonPids();
  const std::string token = cluster().token();
  grpc::Status st;
  EXPECT_EQ(LanePort(cluster().address(), "wrong-token-wrong-token", &st), 0);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  int port = LanePort(cluster().address(), token.c_str(), &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_GT(port, 0);

  // A wrong or missing token: refused with a reply that says so, then closed.
  for (const std::string& bad : {std::string("not-the-token"), std::string()}) {
    int fd = Connect(port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, MakeFrame(1, bad, "")));
    Frame f;
    ASSERT_TRUE(ReadReply(fd, &f));
    EXPECT_EQ(f.code, static_cast<uint16_t>(grpc::StatusCode::UNAUTHENTICATED));
    EXPECT_NE(f.text.find("token"), std::string::npos) << f.text;
    // A call after the refusal is not served: the connection is closed.
    SendAll(fd, MakeFrame(2, "/torus.rpc.Head/GetPlacementGroup", ""));
    EXPECT_FALSE(ReadReply(fd, &f));
    close(fd);
  }
  // A call before any hello: closed, nothing answered.
  {
    int fd = Connect(port);
    ASSERT_GE(fd, 0);
    ASSERT_TRUE(SendAll(fd, MakeFrame(2, "/torus.rpc.Head/GetPlacementGroup", "")));
    Frame f;
    EXPECT_FALSE(ReadReply(fd, &f));
    close(fd);
  }

  // The right token: calls are answered; a bad method or a garbled request gets an error and the
  // connection goes on serving; a malformed frame ends the connection.
  std::string why;
  int fd = HelloLane(port, token, &why);
  ASSERT_GE(fd, 0) << why;
  Frame f;

  rpc::PlacementGroupRequest req;
  req.set_pg_id("no-such-group");
  ASSERT_TRUE(SendAll(fd, MakeFrame(2, "/torus.rpc.Head/GetPlacementGroup", req.SerializeAsString())));
  ASSERT_TRUE(ReadReply(fd, &f));
  EXPECT_EQ(f.code, 0) << f.text;
  rpc::GetPlacementGroupReply reply;
  EXPECT_TRUE(reply.ParseFromString(f.payload));
  EXPECT_FALSE(reply.found());

  ASSERT_TRUE(SendAll(fd, MakeFrame(2, "/torus.rpc.Head/List", "")));  // not served on the lane
  ASSERT_TRUE(ReadReply(fd, &f));
  EXPECT_EQ(f.code, static_cast<uint16_t>(grpc::StatusCode::UNIMPLEMENTED)) << f.text;
  EXPECT_NE(f.text.find("/torus.rpc.Head/List"), std::string::npos) << f.text;

  ASSERT_TRUE(SendAll(fd, MakeFrame(2, "/torus.rpc.Head/GetPlacementGroup", std::string("\xff\xff\xff", 3))));
  ASSERT_TRUE(ReadReply(fd, &f));
  EXPECT_EQ(f.code, static_cast<uint16_t>(grpc::StatusCode::INVALID_ARGUMENT)) << f.text;

  ASSERT_TRUE(SendAll(fd, MakeFrame(2, "/torus.rpc.Head/GetPlacementGroup", req.SerializeAsString())));
  ASSERT_TRUE(ReadReply(fd, &f));
  EXPECT_EQ(f.code, 0) << "the connection stopped serving after an error: " << f.text;

  std::string huge = MakeFrame(2, "x", "");
  uint32_t too_big = 1u << 31;
  memcpy(&huge[12], &too_big, 4);  // a payload of 2 GiB announced
  ASSERT_TRUE(SendAll(fd, huge));
  EXPECT_FALSE(ReadReply(fd, &f)) << "a frame announcing 2 GiB was not refused";
  close(fd);

  // Every node's lane too, with a call the node serves there.
  for (const auto& ep : Endpoints()) {
    if (ep.what.rfind("node", 0) != 0) continue;
    SCOPED_TRACE(ep.what);
    int nport = LanePort(ep.address, token.c_str(), &st);
    ASSERT_TRUE(st.ok()) << st.error_message();
    int nfd = HelloLane(nport, token, &why);
    ASSERT_GE(nfd, 0) << why;
    rpc::BundlesRequest release;
    release.set_pg_id("no-such-group");
    ASSERT_TRUE(SendAll(nfd, MakeFrame(2, "/torus.rpc.Node/ReleaseBundles", release.SerializeAsString())));
    ASSERT_TRUE(ReadReply(nfd, &f));
    EXPECT_EQ(f.code, 0) << f.text;
    rpc::PrepareBundlesReply ledger;
    EXPECT_TRUE(ledger.ParseFromString(f.payload));
    EXPECT_TRUE(ledger.ok());
    // Bundles meant for another node (one that was at this address before a restart) are
    // refused, on the lane and over gRPC, and reserve nothing.
    rpc::BundlesRequest other;
    other.set_pg_id("group-of-another-node");
    other.set_node_id("not-this-node");
    other.set_commit(true);
    (*other.add_bundles()->mutable_resources()->mutable_units())["CPU"] = kUnits / 2;
    ASSERT_TRUE(SendAll(nfd, MakeFrame(2, "/torus.rpc.Node/PrepareBundles", other.SerializeAsString())));
    ASSERT_TRUE(ReadReply(nfd, &f));
    EXPECT_EQ(f.code, static_cast<uint16_t>(grpc::StatusCode::FAILED_PRECONDITION)) << f.text;
    EXPECT_NE(f.text.find("not-this-node"), std::string::npos) << f.text;
    {
      grpc::ClientContext ctx;
      ctx.AddMetadata("torus-token", token);
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
      rpc::PrepareBundlesReply r;
      grpc::Status gs = rpc::Node::NewStub(grpc::CreateChannel(ep.address, grpc::InsecureChannelCredentials()))
                            ->PrepareBundles(&ctx, other, &r);
      EXPECT_EQ(gs.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << gs.error_message();
    }
    ASSERT_TRUE(SendAll(nfd, MakeFrame(2, "/torus.rpc.Node/ReleaseBundles", release.SerializeAsString())));
    ASSERT_TRUE(ReadReply(nfd, &f));
    rpc::PrepareBundlesReply after;
    EXPECT_TRUE(after.ParseFromString(f.payload));
    using Units = std::map<std::string, int64_t>;
    Units before_amounts(ledger.available().units().begin(), ledger.available().units().end());
    Units after_amounts(after.available().units().begin(), after.available().units().end());
    EXPECT_EQ(after_amounts, before_amounts) << "a refused request changed the node's ledger";
    EXPECT_TRUE(SendAndExpectClose(nport, RandomBytes(4096, 7), std::chrono::seconds(10)));
    close(nfd);
  }
  ExpectClusterServes(pids);
}

}  // namespace
}  // namespace torus_test
