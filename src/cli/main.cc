// The `torus` command: CLI and daemons as subcommands.
//
//   torus start --head [--port N] [--num-cpus N] [--resources JSON] [--labels k=v,...] [--block]
//                      [--new-session | --session-dir DIR]
//   torus start --address HOST:PORT [--num-cpus N] [--resources JSON] [--labels k=v,...] [--block]
//   torus stop
//   torus status [--address A]
//   torus list nodes|actors|tasks|objects|workers [--format table|json] [--address A]
//   torus head ... / torus node ... / torus worker      (daemons; started by `start`)
//
// THREADS (daemons): main blocks SIGINT/SIGTERM before any thread starts; a SignalThread
// (cli/daemon_threads.h) waits for them with sigwait() and stops the head/node, whose objects own
// their threads (see head.h, node.h); the head also runs a MallocTrimmer. Both are joined when
// main returns. `start --head --block` waits in sigwait() on the main thread itself.
#include <malloc.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/daemon_threads.h"
#include "cli/flags.h"
#include "cli/resume.h"
#include "cli/table.h"
#include "cli/up.h"
#include "common/labels.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/resources.h"
#include "common/rpc.h"
#include "common/session.h"
#include "common/session_daemons.h"
#include "common/shm_owner.h"
#include "common/wire_states.h"
#include "cli/job.h"
#include "core/worker_main.h"
#include "head/head.h"
#include "head/head_store.h"
#include "node/node.h"

namespace torus {
namespace {

constexpr int kDefaultPort = 7379;

const std::set<std::string> kBoolFlags = {"head", "block", "help", "force", "new-session"};

void BlockSignals(sigset_t* set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, set, nullptr);
}

// ------------------------------------------------------------------------------- daemons

// The head's tuning flags, each with the field it sets; `torus start --head` passes them on.
struct HeadTuningFlag {
  const char* name;
  int HeadConfig::*field;
};
constexpr HeadTuningFlag kHeadTuningFlags[] = {
    {"node-timeout-ms", &HeadConfig::node_timeout_ms},
    {"view-records-per-s", &HeadConfig::view_records_per_s},
    {"max-heartbeats-per-s", &HeadConfig::max_heartbeats_per_s},
    {"push-view-max-nodes", &HeadConfig::push_view_max_nodes},
};

void SetHeadTuning(const Args& a, HeadConfig* cfg) {
  for (const auto& f : kHeadTuningFlags) cfg->*f.field = PositiveIntFlag(a, f.name, cfg->*f.field);
}

int RunHead(const Args& a) {
  // The head daemon is a control plane with many gRPC threads: one malloc arena per thread
  // would keep the memory of bursts (thousands of nodes registering) per thread. Two arenas and
  // a periodic trim keep its resident memory close to what its tables hold
  // (docs/benchmarks_scale.md: bytes per idle node at 10,000 nodes).
  mallopt(M_ARENA_MAX, 2);
  MallocTrimmer trimmer(std::chrono::seconds(10));
  sigset_t set;
  BlockSignals(&set);
  SetLogComponent("head");
  HeadConfig cfg;
  cfg.bind_host = a.Get("bind", "127.0.0.1");
  cfg.port = PortFlag(a, "port", kDefaultPort);
  cfg.session_dir = a.Get("session-dir");
  if (!cfg.session_dir.empty()) cfg.state_path = HeadStore::PathIn(cfg.session_dir);
  SetHeadTuning(a, &cfg);
  auto tok = FindToken(cfg.session_dir);
  if (!tok.ok()) Die(tok.status().message());
  cfg.token = *tok;
  Head head(cfg);
  if (auto s = head.Start(); !s.ok()) Die(s.ToString());
  if (!cfg.session_dir.empty()) (void)WriteFile(cfg.session_dir + "/head_address", head.address());
  SignalThread signals(set, [&] { head.Stop(); });
  head.Wait();
  return 0;
}

StatusOr<NodeConfig> NodeConfigFromArgs(const Args& a) {
  NodeConfig cfg;
  cfg.head_address = a.Get("address");
  if (cfg.head_address.empty()) return InvalidArgument("torus node needs --address HEAD_HOST:PORT");
  cfg.bind_host = a.Get("bind", "127.0.0.1");
  cfg.port = PortFlag(a, "node-port", 0);
  cfg.heartbeat_ms = PositiveIntFlag(a, "heartbeat-ms", cfg.heartbeat_ms);
  if (const char* e = getenv("TORUS_NODE_HEAD_LOST_MS"); e && *e && !a.Has("head-lost-ms")) {
    Args env_flag;
    env_flag.flags["TORUS_NODE_HEAD_LOST_MS"] = e;
    cfg.head_lost_ms = PositiveIntFlag(env_flag, "TORUS_NODE_HEAD_LOST_MS", cfg.head_lost_ms);
  }
  cfg.head_lost_ms = PositiveIntFlag(a, "head-lost-ms", cfg.head_lost_ms);
  cfg.session_dir = a.Get("session-dir");
  auto res = ParseResources(a);
  if (!res.ok()) return res.status();
  cfg.resources = *res;
  auto labels = ParseLabels(a.Get("labels"));
  if (!labels.ok()) return labels.status();
  cfg.labels = *labels;
  cfg.node_group = a.Get("node-group");
  cfg.torus_exe = SelfExecutable();
  auto tok = FindToken(cfg.session_dir);
  if (!tok.ok()) return tok.status();
  cfg.token = *tok;
  return cfg;
}

int RunNode(const Args& a) {
  sigset_t set;
  BlockSignals(&set);
  SetLogComponent("node");
  auto cfg = NodeConfigFromArgs(a);
  if (!cfg.ok()) Die(cfg.status().message());
  Node node(*cfg);
  if (auto s = node.Start(); !s.ok()) Die(s.ToString());
  SignalThread signals(set, [&] { node.Stop(); });
  node.Wait();
  return node.gave_up() ? 1 : 0;
}

// ------------------------------------------------------------------------------- start / stop

pid_t SpawnDaemon(const std::string& session, const std::string& name,
                  const std::vector<std::string>& argv) {
  auto pid = SpawnSessionDaemon(session, name, argv);
  if (!pid.ok()) Die(pid.status().message());
  return *pid;
}

// The live daemons of `session`; pid files naming another process are reported on stderr.
std::vector<SessionDaemon> LiveDaemons(const std::string& session) {
  std::vector<std::string> refused;
  auto live = LiveSessionDaemons(session, &refused);
  for (const auto& r : refused) std::cerr << "torus: " << r << std::endl;
  return live;
}

// Dies if the latest session still has live daemons: a new head would mint a new token and
// the old nodes, unable to join it, would be orphaned with their workers.
void RefuseIfClusterRunning() {
  auto latest = FindLatestSession();
  if (!latest.ok()) Die(latest.status().message());
  if (latest->empty()) return;
  auto live = LiveDaemons(*latest);
  if (live.empty()) return;
  std::string which;
  for (const auto& d : live) {
    which += (which.empty() ? "" : ", ") + std::filesystem::path(d.file).stem().string() + " (pid " +
             std::to_string(d.rec.pid) + ")";
  }
  Die("a Torus cluster of session " + *latest + " is still running: " + which +
      ". A new head would start a new session its nodes cannot join; stop it first with `torus stop`");
}

std::vector<std::string> NodeArgs(const Args& a) {
  std::vector<std::string> v;
  for (const char* k : {"num-cpus", "num-gpus", "memory", "resources", "labels", "bind", "heartbeat-ms",
                        "head-lost-ms"}) {
    if (a.Has(k)) {
      v.push_back(std::string("--") + k);
      v.push_back(a.Get(k));
    }
  }
  return v;
}

bool WaitForNodes(const std::string& address, const std::string& token, size_t n, int timeout_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto stub = rpc::Head::NewStub(GetChannel(address));
  while (std::chrono::steady_clock::now() < deadline) {
    rpc::ListReply reply;
    auto ctx = NewContext(token, 1000);
    if (stub->List(ctx.get(), rpc::Empty(), &reply).ok()) {
      size_t alive = 0;
      for (const auto& nd : reply.nodes()) alive += nd.alive();
      if (alive >= n) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// `torus start --head --block`: head and node in this process until SIGINT/SIGTERM.
int RunHeadInForeground(const Args& a, const std::string& session, int port) {
  sigset_t set;
  BlockSignals(&set);
  SetLogComponent("head");
  HeadConfig hc;
  hc.bind_host = a.Get("bind", "127.0.0.1");
  hc.port = port;
  hc.session_dir = session;
  hc.state_path = HeadStore::PathIn(session);
  auto tok = FindToken(session);
  if (!tok.ok()) Die(tok.status().message());
  hc.token = *tok;
  SetHeadTuning(a, &hc);
  Head head(hc);
  if (auto s = head.Start(); !s.ok()) Die(s.ToString());
  (void)WriteFile(session + "/head_address", head.address());
  Args na = a;
  na.flags["address"] = head.address();
  na.flags["session-dir"] = session;
  auto nc = NodeConfigFromArgs(na);
  if (!nc.ok()) Die(nc.status().message());
  Node node(*nc);
  if (auto s = node.Start(); !s.ok()) Die(s.ToString());
  if (auto s = MakeLatestSession(session); !s.ok()) Die(s.message());
  std::cout << "Torus head running at " << head.address() << " (session " << session
            << "); Ctrl-C stops it." << std::endl;
  int sig;
  sigwait(&set, &sig);
  node.Stop();
  head.Stop();
  return 0;
}

// The command line of the head daemon `torus start --head` spawns.
std::vector<std::string> HeadDaemonArgs(const Args& a, const std::string& self, const std::string& port,
                                        const std::string& session) {
  std::vector<std::string> hargs = {self, "head", "--port", port, "--session-dir", session};
  if (a.Has("bind")) {
    hargs.push_back("--bind");
    hargs.push_back(a.Get("bind"));
  }
  for (const auto& f : kHeadTuningFlags) {
    if (!a.Has(f.name)) continue;
    (void)PositiveIntFlag(a, f.name, 1);  // a bad value dies here, not in the head's log
    hargs.push_back(std::string("--") + f.name);
    hargs.push_back(a.Get(f.name));
  }
  return hargs;
}

// The address the spawned head `hp` writes once it listens (up to 5 s; "" if it did not); death
// with its log if it exits first.
std::string WaitForHeadAddress(const std::string& session, pid_t hp, const std::string& port) {
  std::string address;
  for (int i = 0; i < 500 && address.empty(); ++i) {
    auto r = ReadFile(session + "/head_address");
    if (r.ok()) address = *r;
    else std::this_thread::sleep_for(std::chrono::milliseconds(10));
    int status = 0;
    if (waitpid(hp, &status, WNOHANG) == hp) {
      std::error_code ec;
      std::filesystem::remove(session + "/pids/head.pid", ec);
      auto log = ReadFile(session + "/logs/head.err");
      Die("the head failed to start on port " + port + ":\n" + (log.ok() ? *log : std::string()));
    }
  }
  return address;
}

// `torus start --head` without --block: head and node daemons of a new session.
int SpawnHeadAndNode(const Args& a, const std::string& self, const std::string& session,
                     const std::string& port, bool resumed) {
  std::error_code ec;
  std::filesystem::remove(session + "/head_address", ec);  // a resumed session's is stale
  bool node_live = false;  // a resumed session's own node rode out the head's absence
  for (const auto& d : LiveDaemons(session)) node_live |= std::filesystem::path(d.file).stem() == "node-head";
  pid_t hp = SpawnDaemon(session, "head", HeadDaemonArgs(a, self, port, session));
  std::string address = WaitForHeadAddress(session, hp, port);
  // A failed start leaves nothing running: what it spawned is stopped again.
  auto fail = [&](const std::string& msg) {
    // Only what this command spawned: a resumed session's surviving node keeps its work.
    std::vector<SessionDaemon> ours;
    for (auto& d : LiveDaemons(session)) {
      auto stem = std::filesystem::path(d.file).stem();
      if (stem == "head" || (!node_live && stem == "node-head")) ours.push_back(d);
    }
    TerminateSessionDaemons(ours, std::chrono::seconds(3));
    Die(msg + "; stopped what was started; see " + session + "/logs");
  };
  if (address.empty()) fail("the head did not come up within 5 s");
  std::vector<std::string> nargs = {self, "node", "--address", address, "--session-dir", session};
  for (auto& s : NodeArgs(a)) nargs.push_back(s);
  if (!node_live) SpawnDaemon(session, "node-head", nargs);
  auto token = FindToken(session);
  if (!token.ok()) fail(token.status().message());
  if (!WaitForNodes(address, *token, 1, 10000)) fail("the head's node did not register within 10 s");
  if (auto s = MakeLatestSession(session); !s.ok()) fail(s.message());
  std::cout << "Torus head " << (resumed ? "resumed" : "started") << " at " << address << "\n  session: " << session
            << "\n  join another node: torus start --address " << address
            << "\n  drivers connect with TORUS_ADDRESS=" << address << " (or RAY_ADDRESS)"
            << "\n  stop: torus stop" << std::endl;
  return 0;
}

int StartHead(const Args& a, const std::string& self) {
  if (auto s = CheckSessionRoot(); !s.ok()) Die(s.message());
  auto resume = ChooseHeadSession(a);
  if (!resume.ok()) Die(resume.status().message());
  if (resume->empty()) RefuseIfClusterRunning();
  std::string port = std::to_string(PortFlag(a, "port", kDefaultPort));
  if (port != "0") {
    // Before anything is created: a port in use is refused, never shared.
    std::string why = WhyCannotListen(a.Get("bind", "127.0.0.1"), std::stoi(port));
    if (!why.empty()) Die("cannot start the head on port " + port + ": " + why + "; nothing was started");
  }
  if (!resume->empty()) {
    if (auto s = CheckResume(a, *resume, port); !s.ok()) Die(s.message());
    if (a.Has("block")) return RunHeadInForeground(a, *resume, std::stoi(port));
    return SpawnHeadAndNode(a, self, *resume, port, /*resumed=*/true);
  }
  // session_latest moves to the new session only once its head is up.
  auto session = CreateSession(/*make_latest=*/false);
  if (!session.ok()) Die(session.status().message());
  if (a.Has("block")) return RunHeadInForeground(a, *session, std::stoi(port));
  return SpawnHeadAndNode(a, self, *session, port, /*resumed=*/false);
}

// How many nodes of the cluster at `address` are alive, or death when its head does not answer.
size_t AliveNodes(const std::string& address, const std::string& token) {
  size_t alive = 0;
  auto stub = rpc::Head::NewStub(GetChannel(address));
  rpc::ListReply reply;
  auto ctx = NewContext(token, 5000);
  auto st = stub->List(ctx.get(), rpc::Empty(), &reply);
  if (!st.ok()) Die("cannot reach the head at " + address + ": " + st.error_message());
  for (const auto& n : reply.nodes()) alive += n.alive();
  return alive;
}

// `torus start --address A`: one more node for the cluster at A.
int JoinCluster(const Args& a, const std::string& self) {
  std::string address = a.Get("address");
  if (address.empty()) Die("torus start needs --head or --address HOST:PORT");
  auto token = FindToken();
  if (!token.ok()) Die(token.status().message());
  std::string session = LatestSession();
  if (session.empty()) {
    auto s = CreateSession(true);
    if (!s.ok()) Die(s.status().message());
    session = *s;
  }
  // Count nodes first so we can tell when ours has joined.
  size_t before = AliveNodes(address, *token);
  std::vector<std::string> nargs = {self, "node", "--address", address, "--session-dir", session};
  for (auto& s : NodeArgs(a)) nargs.push_back(s);
  if (a.Has("block")) {
    std::vector<char*> cargv;
    for (auto& s : nargs) cargv.push_back(s.data());
    return RunNode(ParseArgs(static_cast<int>(cargv.size()), cargv.data(), 2, kBoolFlags));
  }
  static int counter = 0;
  std::string name = "node-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  SpawnDaemon(session, name, nargs);
  if (!WaitForNodes(address, *token, before + 1, 10000)) {
    auto log = ReadFile(session + "/logs/" + name + ".err");
    Die("the node did not register within 10 s:\n" + (log.ok() ? *log : std::string()));
  }
  std::cout << "Torus node joined the cluster at " << address << std::endl;
  return 0;
}

int Start(const Args& a) {
  std::string self = SelfExecutable();
  if (auto r = ParseResources(a); !r.ok()) Die(r.status().message());
  if (auto l = ParseLabels(a.Get("labels")); !l.ok()) Die(l.status().message());
  return a.Has("head") ? StartHead(a, self) : JoinCluster(a, self);
}

int Stop(const Args&) {
  namespace fs = std::filesystem;
  if (auto s = CheckSessionRoot(); !s.ok()) Die(s.message());
  std::error_code ec;
  std::vector<SessionDaemon> daemons;
  for (const auto& s : fs::directory_iterator(SessionRoot(), ec)) {
    if (s.is_symlink() || !s.is_directory() ||
        s.path().filename().string().rfind("session_", 0) != 0) {
      continue;
    }
    for (auto& d : LiveDaemons(s.path().string())) daemons.push_back(std::move(d));
  }
  int stopped = TerminateSessionDaemons(daemons, std::chrono::seconds(5));
  // Shared memory of nodes that died without cleaning up (SIGKILL) or were killed just now.
  for (const auto& s : fs::directory_iterator(SessionRoot(), ec)) {
    if (s.is_symlink() || !s.is_directory()) continue;
    CleanDeadNodeSegments(s.path().string());
    MarkSessionEnded(s.path().string());  // stopped whole: a later head starts afresh
  }
  std::cout << "Stopped " << stopped << " Torus process(es)." << std::endl;
  return 0;
}

// ------------------------------------------------------------------------------- status / list

struct Cluster {
  std::string address;
  std::string token;
  rpc::ListReply list;
};

Cluster Connect(const Args& a) {
  Cluster c;
  bool from_session = false;
  c.address = ResolveAddress(a, &from_session);
  if (c.address.empty()) Die("no cluster: pass --address, set TORUS_ADDRESS, or run torus start --head");
  const std::string session = from_session ? LatestSession() : "";
  if (from_session && std::filesystem::exists(session + "/launcher/down")) {
    Die("no Torus cluster is running: the latest one (" + session +
        ") was stopped by torus down; start one with torus start --head or torus up");
  }
  auto tok = FindToken();
  if (!tok.ok()) Die(tok.status().message());
  c.token = *tok;
  auto stub = rpc::Head::NewStub(GetChannel(c.address));
  auto ctx = NewContext(c.token, 5000);
  auto st = stub->List(ctx.get(), rpc::Empty(), &c.list);
  if (!st.ok() && from_session && st.error_code() == grpc::StatusCode::UNAVAILABLE) {
    Die("no Torus cluster is running: the head of the latest session (" + session + ", " + c.address +
        ") does not answer; start one with torus start --head, or pass --address");
  }
  if (!st.ok()) Die("cannot reach the head at " + c.address + ": " + st.error_message());
  return c;
}

nlohmann::ordered_json ResJson(const rpc::ResourceSet& r) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [k, v] : FromProto(r)) j[k] = v;
  return j;
}

// "500 task(s)": the tasks behind a pending demand, counted at their submitters (a submitter
// keeps only a few lease requests in flight however many tasks wait); "2 lease request(s)" when
// no submitter answers.
std::string WaitingTasks(const std::string& token, const rpc::PendingDemand& d,
                         std::map<std::string, rpc::TaskList>* owners) {
  long tasks = 0;
  bool answered = false;
  for (const auto& owner : d.owner_addresses()) {
    auto it = owners->find(owner);
    if (it == owners->end()) {
      rpc::TaskList list;
      auto stub = rpc::CoreWorker::NewStub(GetChannel(owner));
      auto ctx = NewContext(token, 2000);
      if (!stub->ListTasks(ctx.get(), rpc::Empty(), &list).ok()) continue;
      it = owners->emplace(owner, std::move(list)).first;
    }
    answered = true;
    for (const auto& t : it->second.tasks()) {
      tasks += t.actor_id().empty() && t.state() == rpc::TaskInfo::PENDING &&
               "task " + t.name() == d.description();
    }
  }
  if (!answered || tasks == 0) return std::to_string(d.count()) + " lease request(s)";
  return std::to_string(tasks) + " task(s)";
}

int Status_(const Args& a) {
  Cluster c = Connect(a);
  ResourceMap total, avail;
  int alive = 0, dead = 0;
  std::cout << "======== Torus cluster at " << c.address << " ========\nNodes\n";
  for (const auto& n : c.list.nodes()) {
    if (!n.alive()) {
      ++dead;
      continue;
    }
    ++alive;
    Add(total, FromProto(n.total()));
    Add(avail, FromProto(n.available()));
    std::cout << "  " << n.node_id().substr(0, 12) << "  " << n.address() << "  "
              << ResourcesToString(FromProto(n.total())) << "\n";
  }
  std::cout << "  " << alive << " alive, " << dead << " dead\nResources (used / total)\n";
  for (const auto& [k, v] : total) {
    double used = v - (avail.count(k) ? avail[k] : 0);
    bool bytes = k == "memory" || k == "object_store_memory";
    std::cout << "  " << std::setw(24) << std::left << k << " "
              << (bytes ? HumanBytes(used) + " / " + HumanBytes(v) : FormatAmount(used) + " / " + FormatAmount(v))
              << "\n";
  }
  std::cout << "Pending demands\n";
  int pending = 0;
  std::map<std::string, rpc::TaskList> owners;  // address -> its tasks, asked once
  for (const auto& n : c.list.nodes()) {
    if (!n.alive()) continue;
    for (const auto& d : n.pending()) {
      ++pending;
      std::cout << "  " << WaitingTasks(c.token, d, &owners) << " waiting for "
                << ResourcesToString(FromProto(d.resources())) << " " << d.description()
                << (d.infeasible() ? "  (infeasible: no node has these)" : "") << "\n";
    }
  }
  int actors_pending = 0;
  for (const auto& ac : c.list.actors()) {
    if (ac.state() == rpc::ActorRecord::PENDING || ac.state() == rpc::ActorRecord::RESTARTING) {
      ++actors_pending;
      std::cout << "  actor " << ac.class_name() << " (" << ac.actor_id().substr(0, 12) << ") "
                << StateName(ac.state()) << "\n";
    }
  }
  if (pending + actors_pending == 0) std::cout << "  (none)\n";
  return 0;
}

nlohmann::ordered_json ListNodes(const Cluster& c) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& n : c.list.nodes()) {
    nlohmann::ordered_json j;
    j["node_id"] = n.node_id();
    j["address"] = n.address();
    j["hostname"] = n.hostname();
    j["state"] = n.alive() ? "ALIVE" : "DEAD";
    j["heartbeat_ms"] = n.heartbeat_ms();
    j["resources_total"] = ResJson(n.total());
    j["resources_available"] = ResJson(n.available());
    if (n.alive()) {
      // The node's own ledger is the truth; the head's copy lags by up to a heartbeat.
      auto stub = rpc::Node::NewStub(GetChannel(n.address()));
      rpc::NodeInfoReply info;
      auto ctx = NewContext(c.token, 2000);
      if (stub->Info(ctx.get(), rpc::Empty(), &info).ok()) {
        j["resources_available"] = ResJson(info.available());
      }
    }
    nlohmann::ordered_json labels = nlohmann::ordered_json::object();
    for (const auto& [k, v] : n.labels()) labels[k] = v;
    j["labels"] = labels;
    out.push_back(j);
  }
  return out;
}

nlohmann::ordered_json ListActors(const Cluster& c) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& ac : c.list.actors()) {
    nlohmann::ordered_json j;
    j["actor_id"] = ac.actor_id();
    j["class_name"] = ac.class_name();
    j["name"] = ac.name();
    j["namespace"] = ac.ray_namespace();
    j["state"] = StateName(ac.state());
    j["node_id"] = ac.node_id();
    j["num_restarts"] = ac.num_restarts();
    j["death_cause"] = ac.death_cause();
    j["job_id"] = ac.job_id();
    out.push_back(j);
  }
  return out;
}

nlohmann::ordered_json ListPlacementGroups(const Cluster& c) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& pg : c.list.placement_groups()) {
    nlohmann::ordered_json j;
    j["placement_group_id"] = pg.pg_id();
    j["name"] = pg.name();
    j["state"] = StateName(pg.state());
    j["strategy"] = pg.strategy();
    j["job_id"] = pg.job_id();
    j["detached"] = pg.detached();
    j["pending_reason"] = pg.pending_reason();
    nlohmann::ordered_json bundles = nlohmann::ordered_json::array();
    for (const auto& b : pg.bundles()) {
      nlohmann::ordered_json bj;
      bj["index"] = b.index();
      bj["resources"] = ResJson(b.resources());
      bj["node_id"] = b.node_id();
      nlohmann::ordered_json sel = nlohmann::ordered_json::object();
      for (const auto& t : b.label_selector()) sel[t.key()] = t.expr();
      bj["label_selector"] = sel;
      bundles.push_back(bj);
    }
    j["bundles"] = bundles;
    out.push_back(j);
  }
  return out;
}

nlohmann::ordered_json ListSlices(const Cluster& c) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  auto stub = rpc::Head::NewStub(GetChannel(c.address));
  rpc::SliceQueryReply reply;
  auto ctx = NewContext(c.token, 5000);
  auto st = stub->QuerySlices(ctx.get(), rpc::SliceQueryRequest(), &reply);
  if (!st.ok()) Die("slice query failed: " + st.error_message());
  for (const auto& sl : reply.slices()) {
    nlohmann::ordered_json j;
    j["slice_name"] = sl.name();
    j["pod_type"] = sl.pod_type();
    j["topology"] = sl.topology();
    j["hosts_alive"] = sl.hosts_alive();
    j["hosts_expected"] = sl.hosts_expected();
    j["state"] = StateName(sl.state());
    j["holder"] = sl.holder();
    j["node_ids"] = std::vector<std::string>(sl.node_ids().begin(), sl.node_ids().end());
    out.push_back(j);
  }
  return out;
}

// The tasks of every job's driver that answers.
nlohmann::ordered_json ListTasks(const Cluster& c) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& job : c.list.jobs()) {
    auto stub = rpc::CoreWorker::NewStub(GetChannel(job.driver_address()));
    rpc::TaskList tasks;
    auto ctx = NewContext(c.token, 5000);
    if (!stub->ListTasks(ctx.get(), rpc::Empty(), &tasks).ok()) continue;
    for (const auto& t : tasks.tasks()) {
      nlohmann::ordered_json j;
      j["task_id"] = t.task_id();
      j["name"] = t.name();
      j["state"] = StateName(t.state());
      j["job_id"] = t.job_id();
      j["actor_id"] = t.actor_id();
      j["worker_id"] = t.worker_id();
      j["attempt"] = t.attempt();
      j["error"] = t.error();
      j["submitted_ms"] = t.submitted_ms();
      out.push_back(j);
    }
  }
  return out;
}

// `what` ("objects" or "workers") of every live node that answers.
nlohmann::ordered_json ListFromNodes(const Cluster& c, const std::string& what) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const auto& n : c.list.nodes()) {
    if (!n.alive()) continue;
    auto stub = rpc::Node::NewStub(GetChannel(n.address()));
    rpc::NodeInfoReply info;
    auto ctx = NewContext(c.token, 5000);
    if (!stub->Info(ctx.get(), rpc::Empty(), &info).ok()) continue;
    if (what == "objects") {
      for (const auto& o : info.objects()) {
        nlohmann::ordered_json j;
        j["object_id"] = o.object_id();
        j["node_id"] = o.node_id();
        j["size_bytes"] = o.size();
        j["owner_address"] = o.owner_address();
        j["store_key"] = o.key();
        j["offset"] = o.offset();
        out.push_back(j);
      }
    } else {
      for (const auto& w : info.workers()) {
        nlohmann::ordered_json j;
        j["worker_id"] = w.worker_id();
        j["node_id"] = n.node_id();
        j["pid"] = w.pid();
        j["state"] = StateName(w.state());
        j["actor_id"] = w.actor_id();
        out.push_back(j);
      }
    }
  }
  return out;
}

// The rows of `torus list <what>`, or death naming the kinds there are.
nlohmann::ordered_json ListRows(const Cluster& c, const std::string& what) {
  if (what == "nodes") return ListNodes(c);
  if (what == "actors") return ListActors(c);
  if (what == "placement-groups" || what == "placement_groups" || what == "pgs") return ListPlacementGroups(c);
  if (what == "slices") return ListSlices(c);
  if (what == "tasks") return ListTasks(c);
  if (what == "objects" || what == "workers") return ListFromNodes(c, what);
  Die("unknown list kind '" + what + "': expected nodes, actors, tasks, objects, workers, placement-groups or slices");
}

int List(const Args& a) {
  if (a.positional.empty()) Die("usage: torus list nodes|actors|tasks|objects|workers|placement-groups|slices [--format table|json]");
  std::string what = a.positional[0];
  std::string format = a.Get("format", "table");
  if (format != "table" && format != "json") Die("--format must be table or json, got '" + format + "'");
  Cluster c = Connect(a);
  nlohmann::ordered_json out = ListRows(c, what);
  if (format == "json") {
    std::cout << out.dump(2) << std::endl;
    return 0;
  }
  if (out.empty()) {
    std::cout << "(no " << what << ")\n";
    return 0;
  }
  PrintRows(out);
  return 0;
}

void Usage() {
  std::cout << "usage: torus <command> [options]      (torus --version; torus <command> --help)\n"
               "  start --head [--port N] [--num-cpus N] [--num-gpus N] [--memory BYTES] [--resources JSON]\n"
               "        [--labels k=v,...] [--bind HOST] [--block] [--new-session | --session-dir DIR]\n"
               "        (resumes the latest session when it has durable state; docs/fault_tolerance.md)\n"
               "        [--node-timeout-ms MS] [--max-heartbeats-per-s N] [--push-view-max-nodes N] [--view-records-per-s N]\n"
               "  start --address HOST:PORT [--num-cpus N] [--num-gpus N] [--memory BYTES] [--resources JSON]\n"
               "        [--labels k=v,...] [--bind HOST] [--heartbeat-ms MS] [--block]\n"
               "  up FILE.yaml [--wait] [--netns] [--no-atomic-restart]   (docs/launcher.md)\n"
               "  down\n"
               "  stop\n"
               "  status [--address A]\n"
               "  list nodes|actors|tasks|objects|workers|placement-groups|slices [--format table|json] [--address A]\n"
               "  job submit|status|logs|stop|list ...   (torus job --help; docs/jobs.md)\n";
}

// The flags each user-facing command takes; anything else is refused (cli/flags.h).
const std::map<std::string, std::vector<std::string>>& KnownFlags() {
  static const std::map<std::string, std::vector<std::string>> k = [] {
    std::map<std::string, std::vector<std::string>> m = {
        {"start", {"head", "address", "port", "num-cpus", "num-gpus", "memory", "resources", "labels",
                   "bind", "block", "heartbeat-ms", "head-lost-ms", "new-session", "session-dir", "help"}},
        {"stop", {"force", "help"}},
        {"status", {"address", "help"}},
        {"list", {"address", "format", "help"}},
    };
    for (const auto& f : kHeadTuningFlags) m["start"].push_back(f.name);
    return m;
  }();
  return k;
}

}  // namespace
}  // namespace torus

int main(int argc, char** argv) {
  using namespace torus;
  if (argc < 2) {
    Usage();
    return 2;
  }
  std::string cmd = argv[1];
  if (cmd == "--version" || cmd == "version") {
    std::cout << "torus " << TORUS_VERSION << std::endl;
    return 0;
  }
  Args a = ParseArgs(argc, argv, 2, kBoolFlags);
  if (auto known = KnownFlags().find(cmd); known != KnownFlags().end()) {
    RequireKnownFlags(cmd, a.flags, known->second);
    if (a.Has("help")) {
      Usage();
      return 0;
    }
  }
  if (cmd == "head" || cmd == "node" || (cmd == "start" && a.Has("block"))) {
    // Before any thread exists (gRPC starts its own): every thread must inherit the blocked
    // mask so that SIGTERM/SIGINT reach only our sigwait() and shut down cleanly.
    sigset_t set;
    BlockSignals(&set);
  }
  try {
    if (cmd == "head") return RunHead(a);
    if (cmd == "node") return RunNode(a);
    if (cmd == "worker") RunWorkerMain();
    if (cmd == "start") return Start(a);
    if (cmd == "stop") return Stop(a);
    if (cmd == "status") return Status_(a);
    if (cmd == "list") return List(a);
    if (cmd == "up" || cmd == "down" || cmd == "supervise") return RunLauncherCommand(cmd, argc, argv);
    if (cmd == "job") return RunJobCommand(argc, argv);
    if (cmd == "--help" || cmd == "help" || cmd == "-h") {
      Usage();
      return 0;
    }
  } catch (const std::exception& e) {
    Die(e.what());
  }
  std::cerr << "torus: unknown command '" << cmd << "'\n";
  Usage();
  return 2;
}
