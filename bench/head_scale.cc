// The head at scale, over the real protocol: starts a real `torus head` process, registers N
// simulated TPU hosts with it over gRPC (RegisterNode, then Heartbeat at the node period) and
// serves the Node RPCs the head sends them (Prepare/Commit/ReleaseBundles, each node with its own
// ledger: available resources and ledger_seq, replied as src/node/node.cc does). All N nodes
// live in this process behind one gRPC server bound to the wildcard address; node i advertises
// its own loopback address 127.x.y.z:PORT and the call's :authority tells which node is called.
//
// Hosts are v6e 4x4 slices (4 hosts of 4 chips), labelled and resourced by the node's own code
// (tpu::ComputeNodeTpuIdentity, docs/tpu.md section 4). Measured after a warm-up: heartbeats/s
// the head answered, head CPU (from /proc/<pid>/stat), head RSS/PSS minus its RSS/PSS before any
// node registered, false deaths (nodes the head lists dead, "declared dead" in its log), the
// head's decision_us for slice reservations and for an ordinary 4-bundle SPREAD group.
//
// Dead hosts: each simulated node keeps the watch target the head gives it (registration,
// heartbeat replies, Node.SetWatch) and reports it as a node does (Head.ReportPeerLost), and
// answers the head's probes (Node.Ping). Last, --kill K hosts are killed 25 ms apart under the
// full heartbeat load: their heartbeats stop; a killed host's watcher reports it at once (a dead
// process: its kernel closes the watch link) or, for --silent-fraction of them, 2 s later (a
// vanished host: the watcher's keepalive, node/peer_watch.h), and its probes are refused, or for
// silent ones never answered. The watch links themselves are not opened here (two sockets per
// host would pass this machine's open-file limit); tests/failure_test.cc (WatchRingTest) runs
// them for real. A watcher node pulls view deltas every 20 ms over the real heartbeat; a host's
// detection time is from its kill to the view showing it dead.
//
//   head_scale --torus build/torus --nodes 10000 --heartbeat-ms 1000 [--warmup-s 10]
//              [--measure-s 20] [--cycles 50] [--kill 200] [--silent-fraction 0.5]
//              [--csv FILE] [-- HEAD FLAGS...]
// bench/head_scale.sh runs it for 1k, 2k, 5k, 10k nodes.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <iostream>
#include <map>
#include <queue>
#include <random>
#include <set>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/ids.h"
#include "common/resources.h"
#include "common/rpc.h"
#include "common/session.h"
#include "proto/torus.grpc.pb.h"
#include "tpu/node_identity.h"

namespace {
using Clock = std::chrono::steady_clock;
using namespace torus;

struct SimNode {
  std::string id, address, hostname;
  std::map<std::string, std::string> labels;
  ResourceMap total, available;
  uint64_t ledger_seq = 0;
  uint64_t view_version = 0;
  std::map<std::string, std::map<int, ResourceMap>> bundles;  // pg -> index -> resources
  std::string watching;           // its watch target (node id)
  bool killed = false, silent = false;
};

// Reports of watch links ended (Head.ReportPeerLost), each sent at its time by one thread.
struct Reports {
  struct Report {
    std::chrono::steady_clock::time_point at;
    int watcher;
    std::string target;
    std::string how;
    bool operator>(const Report& o) const { return at > o.at; }
  };
  std::mutex mu;
  std::condition_variable cv;
  std::priority_queue<Report, std::vector<Report>, std::greater<Report>> due;
  void Add(Report r) {
    std::lock_guard<std::mutex> lock(mu);
    due.push(std::move(r));
    cv.notify_all();
  }
};
// The delay a watcher takes to see its target's link end: at once for a dead process, after
// keepalive (1 s idle + 1 s probe, node/peer_watch.h) for a vanished host.
constexpr int kSilentDetectMs = 2000;

// Every simulated node's state, guarded by one mutex (calls are rare next to heartbeats).
struct Cluster {
  std::mutex mu;
  std::vector<SimNode> nodes;
  std::unordered_map<std::string, int> by_address;
  std::string token;
  std::atomic<uint64_t> view_records{0};  // NodeRecords received in heartbeat replies
  std::atomic<uint64_t> view_replies{0};  // heartbeat replies that carried a view
  std::atomic<uint64_t> view_bytes{0};    // bytes of views (deltas and snapshots) received
  std::unordered_map<std::string, int> by_id;
  Reports reports;
  // Node w watches `target` from now on (requires mu): a killed target is reported (its link
  // cannot be opened).
  void Watch(int w, const std::string& target) {
    nodes[w].watching = target;
    auto it = by_id.find(target);
    if (it == by_id.end() || !nodes[it->second].killed) return;
    const bool silent = nodes[it->second].silent;
    reports.Add({std::chrono::steady_clock::now() + std::chrono::milliseconds(silent ? kSilentDetectMs : 0), w, target,
                 silent ? "keepalive probes unanswered" : "connection refused"});
  }
};

void FillLedger(const SimNode& n, rpc::PrepareBundlesReply* reply) {
  ToProto(n.available, reply->mutable_available());
  reply->set_ledger_seq(n.ledger_seq);
}

// The Node service of all simulated nodes; which node is called comes from the :authority.
class SimNodeService final : public rpc::Node::Service {
 public:
  explicit SimNodeService(Cluster* c) : c_(c) {}

  grpc::Status SetWatch(grpc::ServerContext* ctx, const rpc::WatchTarget* req, rpc::Empty*) override {
    if (auto s = CheckToken(ctx, c_->token); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(c_->mu);
    SimNode* n = Find(ctx);
    if (!n) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no simulated node at this address");
    if (n->killed) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused");
    c_->Watch(static_cast<int>(n - c_->nodes.data()), req->node_id());
    return grpc::Status::OK;
  }

  // A killed host refuses the probe at once (its process is gone) or, silent, never answers.
  grpc::Status Ping(grpc::ServerContext* ctx, const rpc::PingRequest* req, rpc::Empty*) override {
    if (auto s = CheckToken(ctx, c_->token); !s.ok()) return s;
    bool silent = false;
    {
      std::lock_guard<std::mutex> lock(c_->mu);
      SimNode* n = Find(ctx);
      if (!n) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no simulated node at this address");
      if (n->killed && !n->silent) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "connection refused");
      silent = n->killed;
      if (!silent && req->node_id() != n->id) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "another node");
    }
    if (silent) {
      std::this_thread::sleep_until(ctx->deadline());
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, "no answer");
    }
    return grpc::Status::OK;
  }

  grpc::Status PrepareBundles(grpc::ServerContext* ctx, const rpc::BundlesRequest* req,
                              rpc::PrepareBundlesReply* reply) override {
    if (auto s = CheckToken(ctx, c_->token); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(c_->mu);
    SimNode* n = Find(ctx);
    if (!n) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no simulated node at this address");
    auto& mine = n->bundles[req->pg_id()];
    ResourceMap sum;
    for (const auto& b : req->bundles()) {
      if (!mine.count(b.index())) Add(sum, FromProto(b.resources()));
    }
    if (!Fits(sum, n->available)) {
      if (mine.empty()) n->bundles.erase(req->pg_id());
      reply->set_error("node " + n->id + " has " + ResourcesToString(n->available) +
                       " available, the bundles need " + ResourcesToString(sum));
      FillLedger(*n, reply);
      return grpc::Status::OK;
    }
    Subtract(n->available, sum);
    ++n->ledger_seq;
    for (const auto& b : req->bundles()) {
      if (!mine.count(b.index())) mine[b.index()] = FromProto(b.resources());
    }
    reply->set_ok(true);
    FillLedger(*n, reply);
    return grpc::Status::OK;
  }

  grpc::Status CommitBundles(grpc::ServerContext* ctx, const rpc::BundlesRequest* req,
                             rpc::PrepareBundlesReply* reply) override {
    if (auto s = CheckToken(ctx, c_->token); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(c_->mu);
    SimNode* n = Find(ctx);
    if (!n) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no simulated node at this address");
    reply->set_ok(true);
    FillLedger(*n, reply);
    if (!n->bundles.count(req->pg_id())) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND, "no prepared bundles of " + req->pg_id());
    }
    return grpc::Status::OK;
  }

  grpc::Status ReleaseBundles(grpc::ServerContext* ctx, const rpc::BundlesRequest* req,
                              rpc::PrepareBundlesReply* reply) override {
    if (auto s = CheckToken(ctx, c_->token); !s.ok()) return s;
    std::lock_guard<std::mutex> lock(c_->mu);
    SimNode* n = Find(ctx);
    if (!n) return grpc::Status(grpc::StatusCode::NOT_FOUND, "no simulated node at this address");
    reply->set_ok(true);
    auto pit = n->bundles.find(req->pg_id());
    if (pit != n->bundles.end()) {
      ++n->ledger_seq;
      std::map<int, bool> which;
      for (const auto& b : req->bundles()) which[b.index()] = true;
      for (auto bit = pit->second.begin(); bit != pit->second.end();) {
        if (!which.empty() && !which.count(bit->first)) {
          ++bit;
          continue;
        }
        Add(n->available, bit->second);
        bit = pit->second.erase(bit);
      }
      if (pit->second.empty()) n->bundles.erase(pit);
    }
    FillLedger(*n, reply);
    return grpc::Status::OK;
  }

 private:
  SimNode* Find(grpc::ServerContext* ctx) {
    auto authority = ctx->ExperimentalGetAuthority();
    auto it = c_->by_address.find(std::string(authority.data(), authority.size()));
    return it == c_->by_address.end() ? nullptr : &c_->nodes[it->second];
  }
  Cluster* c_;
};

// ------------------------------------------------------------------------------- head process

struct ProcMem {
  long rss_kb = 0, pss_kb = 0;
};

ProcMem ReadMem(pid_t pid) {
  ProcMem m;
  std::ifstream st("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(st, line)) {
    if (line.rfind("VmRSS:", 0) == 0) m.rss_kb = std::stol(line.substr(6));
  }
  std::ifstream sm("/proc/" + std::to_string(pid) + "/smaps_rollup");
  while (std::getline(sm, line)) {
    if (line.rfind("Pss:", 0) == 0) m.pss_kb = std::stol(line.substr(4));
  }
  return m;
}

// utime + stime of a process, in clock ticks.
long CpuTicks(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string s((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto p = s.rfind(')');
  if (p == std::string::npos) return 0;
  std::istringstream in(s.substr(p + 2));
  std::string field;
  long utime = 0, stime = 0;
  for (int i = 3; i <= 15 && in >> field; ++i) {
    if (i == 14) utime = std::stol(field);
    if (i == 15) stime = std::stol(field);
  }
  return utime + stime;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}
double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
}

pid_t g_head_pid = 0;

[[noreturn]] void Fail(const std::string& msg) {
  std::cerr << "head_scale: " << msg << std::endl;
  if (g_head_pid > 0) {
    kill(g_head_pid, SIGKILL);
    waitpid(g_head_pid, nullptr, 0);
  }
  _exit(1);
}

// ------------------------------------------------------------------------------- heartbeats

struct HbCall {
  int node = 0;
  grpc::ClientContext ctx;
  rpc::HeartbeatRequest req;
  rpc::HeartbeatReply reply;
  grpc::Status status;
  Clock::time_point sent;
  std::unique_ptr<grpc::ClientAsyncResponseReader<rpc::HeartbeatReply>> reader;
};

}  // namespace

int main(int argc, char** argv) {
  std::string torus_exe = "build/torus", csv;
  int num_nodes = 1000, heartbeat_ms = 1000, warmup_s = 10, measure_s = 20, cycles = 50;
  int channels = 8;
  int kills = 200;
  double silent_fraction = 0.5;
  std::vector<std::string> head_flags;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&] {
      if (i + 1 >= argc) Fail(a + " needs a value");
      return std::string(argv[++i]);
    };
    if (a == "--") {
      for (++i; i < argc; ++i) head_flags.push_back(argv[i]);
    } else if (a == "--torus") torus_exe = next();
    else if (a == "--nodes") num_nodes = std::stoi(next());
    else if (a == "--heartbeat-ms") heartbeat_ms = std::stoi(next());
    else if (a == "--warmup-s") warmup_s = std::stoi(next());
    else if (a == "--measure-s") measure_s = std::stoi(next());
    else if (a == "--cycles") cycles = std::stoi(next());
    else if (a == "--channels") channels = std::stoi(next());
    else if (a == "--csv") csv = next();
    else if (a == "--kill") kills = std::stoi(next());
    else if (a == "--silent-fraction") silent_fraction = std::stod(next());
    else Fail("unknown flag " + a);
  }
  if (num_nodes % 4 != 0 || num_nodes > 60000) Fail("--nodes must be a multiple of 4, at most 60000");
  if (kills < 0 || kills > num_nodes / 2) Fail("--kill must be between 0 and half the nodes");

  // A session of our own, and the head in it.
  auto session = CreateSession(false);
  if (!session.ok()) Fail(session.status().ToString());
  auto token = FindToken(*session);
  if (!token.ok()) Fail(token.status().ToString());
  std::string head_log = *session + "/head.log";
  pid_t head_pid = fork();
  if (head_pid == 0) {
    int fd = open(head_log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 1);
    dup2(fd, 2);
    std::vector<std::string> args = {torus_exe, "head", "--port", "0", "--session-dir", *session};
    for (auto& f : head_flags) args.push_back(f);
    std::vector<char*> cargs;
    for (auto& s : args) cargs.push_back(s.data());
    cargs.push_back(nullptr);
    execv(torus_exe.c_str(), cargs.data());
    _exit(127);
  }
  g_head_pid = head_pid;
  std::string head_address;
  for (int i = 0; i < 1000 && head_address.empty(); ++i) {
    auto r = ReadFile(*session + "/head_address");
    if (r.ok() && !r->empty()) head_address = *r;
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (head_address.empty()) Fail("the head did not start; see " + head_log);
  auto kill_head = [&] {
    kill(head_pid, SIGTERM);
    for (int i = 0; i < 300; ++i) {
      if (waitpid(head_pid, nullptr, WNOHANG) == head_pid) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    kill(head_pid, SIGKILL);
    waitpid(head_pid, nullptr, 0);
  };
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ProcMem base = ReadMem(head_pid);

  // The simulated nodes and their server.
  Cluster c;
  c.token = *token;
  SimNodeService service(&c);
  int port = 0;
  auto server = StartServer("0.0.0.0", &port, {&service});
  if (!server || port == 0) Fail("cannot start the node server");
  c.nodes.resize(num_nodes);
  for (int i = 0; i < num_nodes; ++i) {
    SimNode& n = c.nodes[i];
    int slice = i / 4, worker = i % 4;
    int a = 1 + (i >> 16), b = (i >> 8) & 255, d = i & 255;
    n.address = "127." + std::to_string(a) + "." + std::to_string(b) + "." + std::to_string(d) + ":" +
                std::to_string(port);
    n.id = RandomHex(14);
    char slice_name[32];
    snprintf(slice_name, sizeof slice_name, "sim-v6e16-%05d", slice);
    n.hostname = std::string(slice_name) + "-w" + std::to_string(worker);
    std::string hosts;
    for (int w = 0; w < 4; ++w) hosts += (w ? "," : "") + std::string(slice_name) + "-w" + std::to_string(w);
    tpu::NodeTpuInput in;
    in.env = {{"TPU_NAME", slice_name},
              {"TPU_WORKER_ID", std::to_string(worker)},
              {"TPU_ACCELERATOR_TYPE", "v6e-16"},
              {"TPU_TOPOLOGY", "4x4"},
              {"TPU_WORKER_HOSTNAMES", hosts},
              {"TORUS_TPU_CHIPS", "4"}};
    auto id = tpu::ComputeNodeTpuIdentity(in);
    if (!id.ok()) Fail(id.status().ToString());
    n.labels = id->labels;
    n.labels["torus.io/node-id"] = n.id;
    n.labels["torus.io/hostname"] = n.hostname;
    n.total = {{"CPU", 8}, {"memory", 64.0 * (1ull << 30)}};
    for (const auto& [k, v] : id->resources) n.total[k] = v;
    n.available = n.total;
    c.by_address[n.address] = i;
    c.by_id[n.id] = i;
  }

  // Channels to the head: a few connections shared by the nodes (see docs/benchmarks_scale.md).
  std::vector<std::unique_ptr<rpc::Head::Stub>> stubs;
  for (int k = 0; k < channels; ++k) {
    grpc::ChannelArguments args;
    args.SetInt("torus.head_scale.channel", k);  // distinct args: a connection of its own
    args.SetMaxReceiveMessageSize(-1);
    stubs.push_back(rpc::Head::NewStub(
        grpc::CreateCustomChannel(head_address, grpc::InsecureChannelCredentials(), args)));
  }
  auto register_node = [&](int i) {
    rpc::RegisterNodeRequest req;
    auto* r = req.mutable_node();
    {
      std::lock_guard<std::mutex> lock(c.mu);
      const SimNode& n = c.nodes[i];
      r->set_node_id(n.id);
      r->set_address(n.address);
      r->set_hostname(n.hostname);
      r->set_pid(100000 + i);
      r->set_alive(true);
      ToProto(n.total, r->mutable_total());
      ToProto(n.available, r->mutable_available());
      for (const auto& [k, v] : n.labels) (*r->mutable_labels())[k] = v;
    }
    rpc::RegisterNodeReply reply;
    auto ctx = NewContext(c.token, 30000);
    auto st = stubs[i % channels]->RegisterNode(ctx.get(), req, &reply);
    if (st.ok()) {
      std::lock_guard<std::mutex> lock(c.mu);
      c.Watch(i, reply.watch().node_id());
    }
    return st;
  };

  // Heartbeats: node i beats at phase i*P/N of each period P, asynchronously, once registered.
  std::unique_ptr<std::atomic<bool>[]> registered(new std::atomic<bool>[num_nodes]);
  for (int i = 0; i < num_nodes; ++i) registered[i] = false;
  grpc::CompletionQueue cq;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> hb_ok{0}, hb_fail{0}, hb_unknown{0};
  std::atomic<uint32_t> paced_ms{0};
  std::mutex lat_mu;
  std::vector<double> hb_lat_ms;
  bool record_lat = false;
  std::thread completer([&] {
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
      std::unique_ptr<HbCall> call(static_cast<HbCall*>(tag));
      if (!call->status.ok()) {
        ++hb_fail;
        continue;
      }
      ++hb_ok;
      paced_ms = call->reply.heartbeat_ms();
      {
        std::lock_guard<std::mutex> lock(lat_mu);
        if (record_lat) {
          hb_lat_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - call->sent).count());
        }
      }
      if (call->reply.unknown_node()) {
        ++hb_unknown;
        (void)register_node(call->node);
        continue;
      }
      if (call->reply.has_watch()) {
        std::lock_guard<std::mutex> lock(c.mu);
        c.Watch(call->node, call->reply.watch().node_id());
      }
      if (call->reply.nodes_size() > 0 || call->reply.view_version() != call->req.view_version()) {
        c.view_records += call->reply.nodes_size();
        c.view_bytes += call->reply.ByteSizeLong();
        ++c.view_replies;
        std::lock_guard<std::mutex> lock(c.mu);
        c.nodes[call->node].view_version = call->reply.view_version();
      }
    }
  });
  // The head paces heartbeats (HeartbeatReply.heartbeat_ms): every simulated node beats at the
  // longer of --heartbeat-ms and the period the head asked for, as Node::HeartbeatLoop does.
  std::thread beater([&] {
    double credit = 0;  // heartbeats due but not yet issued
    auto last = Clock::now();
    int64_t sent = 0;   // heartbeats issued so far, node = sent % N
    while (!stop) {
      auto now = Clock::now();
      int period_ms = std::max<int>(heartbeat_ms, static_cast<int>(paced_ms.load()));
      credit += std::chrono::duration<double>(now - last).count() * 1000.0 / period_ms * num_nodes;
      last = now;
      for (; credit >= 1 && !stop; credit -= 1, ++sent) {
        if (!registered[sent % num_nodes]) continue;
        auto* call = new HbCall;
        call->node = static_cast<int>(sent % num_nodes);
        {
          std::lock_guard<std::mutex> lock(c.mu);
          const SimNode& n = c.nodes[call->node];
          call->req.set_node_id(n.id);
          ToProto(n.available, call->req.mutable_available());
          call->req.set_ledger_seq(n.ledger_seq);
          call->req.set_view_version(n.view_version);
          call->req.set_watching(n.watching);
        }
        call->req.set_heartbeat_ms(static_cast<uint32_t>(period_ms));
        call->ctx.AddMetadata(kTokenMetadataKey, c.token);
        call->ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
        call->sent = Clock::now();
        call->reader = stubs[call->node % channels]->AsyncHeartbeat(&call->ctx, call->req, &cq);
        call->reader->Finish(&call->reply, &call->status, call);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  });

  auto reg_start = Clock::now();
  {
    std::vector<std::thread> ts;
    std::atomic<int> next{0};
    for (int t = 0; t < 8; ++t) {
      ts.emplace_back([&] {
        for (int i; (i = next++) < num_nodes;) {
          auto st = register_node(i);
          // As a node does, a registration the head could not take yet is sent again.
          for (int attempt = 1; !st.ok() && st.error_code() == grpc::StatusCode::UNAVAILABLE && attempt < 10; ++attempt) {
            std::this_thread::sleep_for(std::chrono::milliseconds(200 * attempt));
            st = register_node(i);
          }
          if (!st.ok()) Fail("RegisterNode failed: " + st.error_message());
          registered[i] = true;  // heartbeats start right away, as a node's do
        }
      });
    }
    for (auto& t : ts) t.join();
  }
  double reg_s = std::chrono::duration<double>(Clock::now() - reg_start).count();
  std::this_thread::sleep_for(std::chrono::seconds(warmup_s));
  // Measurement window.
  uint64_t ok0 = hb_ok, fail0 = hb_fail, vr0 = c.view_records, vb0 = c.view_bytes;
  long cpu0 = CpuTicks(head_pid);
  auto t0 = Clock::now();
  {
    std::lock_guard<std::mutex> lock(lat_mu);
    record_lat = true;
  }
  std::this_thread::sleep_for(std::chrono::seconds(measure_s));
  {
    std::lock_guard<std::mutex> lock(lat_mu);
    record_lat = false;
  }
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  long cpu1 = CpuTicks(head_pid);
  double hb_per_s = (hb_ok - ok0) / secs;
  double hb_fail_per_s = (hb_fail - fail0) / secs;
  double view_rec_per_s = (c.view_records - vr0) / secs;
  double view_kb_per_s = (c.view_bytes - vb0) / secs / 1024;
  double head_cpu = (cpu1 - cpu0) / static_cast<double>(sysconf(_SC_CLK_TCK)) / secs * 100.0;
  ProcMem mem = ReadMem(head_pid);

  // Reservations, while the nodes keep heartbeating.
  rpc::Head::Stub& head = *stubs[0];
  int pg_not_created = 0;
  // An ordinary group of 4 bundles per strategy, a SPREAD group selecting one slice's hosts by
  // label, and a SPREAD group of a resource only a quarter of the hosts have.
  struct Variant {
    std::string name, strategy;
    bool slice = false, by_label = false, custom = false;
  };
  const std::vector<Variant> variants = {
      {"slice", "SPREAD", true},           {"pack4", "PACK"},
      {"spread4", "SPREAD"},               {"strict_pack4", "STRICT_PACK"},
      {"strict_spread4", "STRICT_SPREAD"}, {"spread4_label", "SPREAD", false, true},
      {"spread4_custom", "SPREAD", false, false, true}};
  auto reserve_cycles = [&](const Variant& v, int n, std::vector<double>* decision,
                            std::vector<double>* rtt) {
    const bool slice = v.slice;
    for (int k = 0; k < n; ++k) {
      rpc::PlacementGroupRecord req;
      req.set_name("scale-" + v.name + "-" + std::to_string(k));
      req.set_strategy(v.strategy);
      if (slice) {
        auto* sl = req.mutable_slice();
        sl->set_topology("4x4");
        sl->set_accelerator_version("v6e");
        sl->set_num_slices(1);
        sl->set_timeout_ms(-1);
        for (int b = 0; b < 4; ++b) {
          auto* bundle = req.add_bundles();
          ResourceMap am{{"CPU", 1}, {"TPU", 4}};
          if (b == 0) am["TPU-v6e-16-head"] = 1;
          ToProto(am, bundle->mutable_resources());
          auto* t = bundle->add_label_selector();
          t->set_key("torus.io/tpu-pod-type");
          t->set_expr("v6e-16");
          t = bundle->add_label_selector();
          t->set_key("torus.io/accelerator-type");
          t->set_expr("TPU-V6E");
        }
      } else {
        char wanted[32];
        snprintf(wanted, sizeof wanted, "sim-v6e16-%05d", (k * 7919) % std::max(1, num_nodes / 4));
        for (int b = 0; b < 4; ++b) {
          auto* bundle = req.add_bundles();
          ToProto({{v.custom ? "TPU-v6e-16-head" : "CPU", 1}}, bundle->mutable_resources());
          if (v.by_label) {
            auto* t = bundle->add_label_selector();
            t->set_key(std::string(tpu::kLabelSliceName));
            t->set_expr(wanted);
          }
        }
      }
      auto t_start = Clock::now();
      rpc::CreatePlacementGroupReply cr;
      auto ctx = NewContext(c.token, 30000);
      auto st = head.CreatePlacementGroup(ctx.get(), req, &cr);
      if (!st.ok() || (cr.has_error() && cr.error().code() != 0)) {
        Fail("CreatePlacementGroup: " + st.error_message() + cr.error().message());
      }
      rpc::PlacementGroupRequest g;
      g.set_pg_id(cr.pg_id());
      g.set_wait_created_ms(30000);
      rpc::GetPlacementGroupReply gr;
      auto ctx2 = NewContext(c.token, 40000);
      st = head.GetPlacementGroup(ctx2.get(), g, &gr);
      if (!st.ok() || gr.pg().state() != rpc::PlacementGroupRecord::CREATED) {
        // Counted, not fatal: e.g. a prepare that timed out on a loaded machine.
        std::cerr << "head_scale: placement group not created in 30 s: " << st.error_message() << " "
                  << gr.pg().pending_reason() << std::endl;
        ++pg_not_created;
        rpc::Empty e;
        auto ctx3 = NewContext(c.token, 30000);
        (void)head.RemovePlacementGroup(ctx3.get(), g, &e);
        continue;
      }
      rtt->push_back(std::chrono::duration<double, std::micro>(Clock::now() - t_start).count());
      decision->push_back(gr.pg().decision_us());
      rpc::Empty e;
      auto ctx3 = NewContext(c.token, 30000);
      st = head.RemovePlacementGroup(ctx3.get(), g, &e);
      if (!st.ok()) Fail("RemovePlacementGroup: " + st.error_message());
    }
  };
  std::vector<std::vector<double>> dec(variants.size()), rtts(variants.size());
  for (size_t i = 0; i < variants.size(); ++i) reserve_cycles(variants[i], cycles, &dec[i], &rtts[i]);
  const auto& slice_dec = dec[0];
  const auto& slice_rtt = rtts[0];
  const auto& pg_dec = dec[2];
  const auto& pg_rtt = rtts[2];

  // Kills, under the full heartbeat load, 25 ms apart; reports go out as the watchers would send
  // them; a view watcher (node 0, never killed) pulls view deltas every 20 ms over the real
  // heartbeat and times each death as a node would see it.
  std::vector<double> detect_s, detect_closed_s, detect_silent_s;
  int killed_silent = 0, undetected = 0;
  std::set<std::string> false_dead;  // nodes the view showed dead that were not killed
  std::set<int> killed;
  std::atomic<bool> reporting{true};
  std::thread reporter([&] {
    std::unique_lock<std::mutex> lock(c.reports.mu);
    while (reporting) {
      if (c.reports.due.empty()) {
        c.reports.cv.wait_for(lock, std::chrono::milliseconds(100));
        continue;
      }
      auto r = c.reports.due.top();
      if (r.at > Clock::now()) {
        c.reports.cv.wait_until(lock, r.at);
        continue;
      }
      c.reports.due.pop();
      lock.unlock();
      rpc::PeerLostRequest req;
      {
        std::lock_guard<std::mutex> l(c.mu);
        req.set_watcher_id(c.nodes[r.watcher].id);
      }
      req.set_node_id(r.target);
      req.set_how(r.how);
      rpc::Empty e;
      auto ctx = NewContext(c.token, 2000);
      (void)stubs[r.watcher % channels]->ReportPeerLost(ctx.get(), req, &e);
      lock.lock();
    }
  });
  if (kills > 0) {
    std::mt19937 rng(12345);
    std::vector<int> cand;
    for (int i = 4; i < num_nodes; ++i) cand.push_back(i);
    std::shuffle(cand.begin(), cand.end(), rng);
    std::mutex wmu;
    std::vector<Clock::time_point> kill_at(num_nodes);
    std::vector<char> silent(num_nodes, 0);
    std::map<int, double> seen;
    uint64_t wver = 0;
    auto note_dead = [&](const std::string& id, Clock::time_point now) {
      auto it = c.by_id.find(id);
      if (it == c.by_id.end()) return;
      std::lock_guard<std::mutex> lock(wmu);
      if (!killed.count(it->second)) {
        false_dead.insert(id);
      } else if (!seen.count(it->second)) {
        seen[it->second] = std::chrono::duration<double>(now - kill_at[it->second]).count();
      }
    };
    auto watch_once = [&] {
      rpc::HeartbeatRequest req;
      {
        std::lock_guard<std::mutex> lock(c.mu);
        const SimNode& n = c.nodes[0];
        req.set_node_id(n.id);
        ToProto(n.available, req.mutable_available());
        req.set_ledger_seq(n.ledger_seq);
        req.set_watching(n.watching);
      }
      req.set_view_version(wver);
      req.set_want_view(true);
      req.set_heartbeat_ms(std::max<uint32_t>(heartbeat_ms, paced_ms.load()));
      rpc::HeartbeatReply reply;
      auto ctx = NewContext(c.token, 5000);
      if (!stubs[0]->Heartbeat(ctx.get(), req, &reply).ok()) return;
      const auto now = Clock::now();
      if (reply.has_watch()) {
        std::lock_guard<std::mutex> lock(c.mu);
        c.Watch(0, reply.watch().node_id());
      }
      if (reply.view_version() == wver) return;
      if (reply.view_delta()) {
        for (const auto& id : reply.removed_node_ids()) note_dead(id, now);
        for (const auto& r : reply.nodes()) {
          if (!r.alive()) note_dead(r.node_id(), now);
        }
      } else if (!reply.view_snapshot().empty()) {
        if (wver != 0) {  // a whole view: every killed node missing from it is dead by now
          rpc::ListReply all;
          all.ParseFromString(reply.view_snapshot());
          std::set<std::string> alive_ids;
          for (const auto& r : all.nodes()) alive_ids.insert(r.node_id());
          std::vector<std::string> gone;
          {
            std::lock_guard<std::mutex> lock(wmu);
            for (int k : killed) {
              if (!alive_ids.count(c.nodes[k].id)) gone.push_back(c.nodes[k].id);
            }
          }
          for (const auto& id : gone) note_dead(id, now);
        }
      } else if (reply.nodes_size() == 0) {
        return;  // paced: ask again
      }
      wver = reply.view_version();
    };
    for (int i = 0; i < 100 && wver == 0; ++i) watch_once();
    std::atomic<bool> watching{true};
    std::thread viewer([&] {
      while (watching) {
        watch_once();
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
    const int silent_every = silent_fraction > 0 ? std::max(1, static_cast<int>(1.0 / silent_fraction + 0.5)) : 0;
    for (int k = 0; k < kills; ++k) {
      const int x = cand[k];
      const bool quiet = silent_every > 0 && k % silent_every == 0;
      registered[x] = false;  // its heartbeats stop
      const auto now = Clock::now();
      {
        std::lock_guard<std::mutex> lock(wmu);
        killed.insert(x);
        kill_at[x] = now;
        silent[x] = quiet;
      }
      killed_silent += quiet;
      {
        std::lock_guard<std::mutex> lock(c.mu);
        c.nodes[x].killed = true;
        c.nodes[x].silent = quiet;
        for (int w = 0; w < num_nodes; ++w) {
          if (c.nodes[w].killed || c.nodes[w].watching != c.nodes[x].id) continue;
          c.reports.Add({now + std::chrono::milliseconds(quiet ? kSilentDetectMs : 0), w, c.nodes[x].id,
                         quiet ? "keepalive probes unanswered" : "closed by its node"});
        }
      }
      std::this_thread::sleep_until(now + std::chrono::milliseconds(25));
    }
    // Every death seen (at most 60 s after the last kill), then 2 s more for false ones.
    auto until = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < until) {
      {
        std::lock_guard<std::mutex> lock(wmu);
        if (seen.size() == killed.size()) break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    std::this_thread::sleep_for(std::chrono::seconds(2));
    watching = false;
    viewer.join();
    for (int i : killed) {
      auto it = seen.find(i);
      if (it == seen.end()) {
        ++undetected;
        continue;
      }
      detect_s.push_back(it->second);
      (silent[i] ? detect_silent_s : detect_closed_s).push_back(it->second);
    }
  }
  reporting = false;
  c.reports.cv.notify_all();
  reporter.join();

  // Liveness as the head sees it, then stop.
  rpc::ListReply list;
  {
    auto ctx = NewContext(c.token, 30000);
    (void)head.List(ctx.get(), rpc::Empty(), &list);
  }
  int alive = 0;
  for (const auto& n : list.nodes()) alive += n.alive();
  alive += static_cast<int>(killed.size()) - undetected;  // the killed ones are not false deaths
  stop = true;
  beater.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(500));
  int declared_dead = 0;
  {
    std::ifstream f(head_log);
    std::string line;
    while (std::getline(f, line)) declared_dead += line.find("declared dead") != std::string::npos;
  }
  declared_dead -= static_cast<int>(killed.size()) - undetected;  // those were meant
  kill_head();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
  cq.Shutdown();
  completer.join();

  double loadavg = 0;
  {
    std::ifstream f("/proc/loadavg");
    f >> loadavg;
  }
  double per_node_rss = (mem.rss_kb - base.rss_kb) * 1024.0 / num_nodes;
  double per_node_pss = (mem.pss_kb - base.pss_kb) * 1024.0 / num_nodes;
  std::vector<double> lat;
  {
    std::lock_guard<std::mutex> lock(lat_mu);
    lat = hb_lat_ms;
  }
  std::ostringstream row;
  row << num_nodes << "," << heartbeat_ms << "," << reg_s << "," << hb_per_s << "," << hb_fail_per_s << ","
      << head_cpu << "," << Median(lat) << "," << Pct(lat, 0.99) << "," << view_rec_per_s << "," << view_kb_per_s << ","
      << base.rss_kb << "," << mem.rss_kb << "," << per_node_rss << "," << base.pss_kb << "," << mem.pss_kb
      << "," << per_node_pss << "," << (num_nodes - alive) << "," << declared_dead << "," << hb_unknown << ","
      << Median(slice_dec) << "," << Pct(slice_dec, 0.9) << "," << Median(slice_rtt) / 1000 << ","
      << Median(pg_dec) << "," << Median(pg_rtt) / 1000 << "," << pg_not_created << "," << paced_ms.load() << "," << loadavg;
  for (size_t i = 1; i < variants.size(); ++i) row << "," << Median(dec[i]) << "," << Pct(dec[i], 0.99);
  auto mx = [](const std::vector<double>& v) { return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()); };
  row << "," << killed.size() << "," << killed_silent << "," << undetected << "," << false_dead.size() << ","
      << Median(detect_s) << "," << Pct(detect_s, 0.99) << "," << mx(detect_s) << "," << Median(detect_closed_s)
      << "," << Pct(detect_closed_s, 0.99) << "," << Median(detect_silent_s) << "," << Pct(detect_silent_s, 0.99) << ","
      << Pct(slice_dec, 0.99);
  std::string header =
      "nodes,heartbeat_ms,register_s,heartbeats_per_s,heartbeat_failures_per_s,head_cpu_pct,"
      "heartbeat_p50_ms,heartbeat_p99_ms,view_records_per_s,view_kb_per_s,rss_base_kb,rss_kb,rss_bytes_per_node,"
      "pss_base_kb,pss_kb,pss_bytes_per_node,false_deaths,declared_dead_log,unknown_node_replies,"
      "slice_decision_us_p50,slice_decision_us_p90,slice_reserve_ms_p50,pg_spread4_decision_us_p50,"
      "pg_spread4_reserve_ms_p50,groups_not_created,paced_heartbeat_ms,loadavg1";
  for (size_t i = 1; i < variants.size(); ++i) {
    header += ",pg_" + variants[i].name + "_decision_us_p50,pg_" + variants[i].name + "_decision_us_p99";
  }
  header += ",killed,killed_silent,undetected,false_dead_in_view,detect_s_p50,detect_s_p99,detect_s_max,"
            "detect_closed_s_p50,detect_closed_s_p99,detect_silent_s_p50,detect_silent_s_p99,slice_decision_us_p99";
  std::cout << header << "\n" << row.str() << std::endl;
  if (!csv.empty()) {
    bool fresh = !std::ifstream(csv).good();
    std::ofstream out(csv, std::ios::app);
    if (fresh) out << header << "\n";
    out << row.str() << "\n";
  }
  return 0;
}
