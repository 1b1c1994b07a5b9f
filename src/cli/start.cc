#include "cli/start.h"

#include <malloc.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <thread>

#include "cli/daemon_threads.h"
#include "cli/head_etcd.h"
#include "cli/resume.h"
#include "common/labels.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/resources.h"
#include "common/rpc.h"
#include "common/session.h"
#include "common/session_daemons.h"
#include "head/head.h"
#include "head/etcd_client.h"
#include "head/head_store.h"
#include "node/node.h"

namespace torus {

const std::set<std::string> kBoolFlags = {"head", "block", "help", "force", "new-session",
                                          "dashboard-port-fallback", "dashboard-agent-port-fallback",
                                          "serve-session-logs", "follow", "err"};


namespace {
constexpr int kDefaultPort = 7379;

// A port flag where -1 means "none".
int OptionalPortFlag(const Args& a, const std::string& flag, int def) {
  return a.Get(flag, std::to_string(def)) == "-1" ? -1 : PortFlag(a, flag, def);
}
}  // namespace

void BlockSignals(sigset_t* set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, set, nullptr);
}

// ------------------------------------------------------------------------------- daemons

namespace {

constexpr int kDefaultDashboardPort = 8265;  // Ray's

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
    {"keep-dead-nodes", &HeadConfig::keep_dead_nodes},
    {"stray-bundle-grace-ms", &HeadConfig::stray_bundle_grace_ms},
};

void SetHeadTuning(const Args& a, HeadConfig* cfg) {
  for (const auto& f : kHeadTuningFlags) cfg->*f.field = PositiveIntFlag(a, f.name, cfg->*f.field);
}

// The HTTP surface as `torus start --head` asks for it: --dashboard-port (strict) or Ray's 8265
// (moved to a free port when taken), on --dashboard-host (loopback by default); none with
// --include-dashboard false.
void SetDashboardFromStart(const Args& a, HeadConfig* cfg) {
  std::string include = a.Get("include-dashboard", "true");
  for (auto& c : include) c = static_cast<char>(tolower(c));
  if (include != "true" && include != "false" && include != "1" && include != "0") {
    Die("--include-dashboard must be true or false, got '" + a.Get("include-dashboard") + "'");
  }
  cfg->dashboard_host = a.Get("dashboard-host", "127.0.0.1");
  if (include == "false" || include == "0") {
    cfg->dashboard_port = -1;
    return;
  }
  cfg->dashboard_port = PortFlag(a, "dashboard-port", kDefaultDashboardPort);
  cfg->dashboard_port_fallback = !a.Has("dashboard-port");
}

// The same as the head daemon's flags.
std::vector<std::string> DashboardDaemonArgs(const HeadConfig& cfg) {
  std::vector<std::string> v = {"--dashboard-host", cfg.dashboard_host, "--dashboard-port",
                                std::to_string(cfg.dashboard_port)};
  if (cfg.dashboard_port_fallback) v.push_back("--dashboard-port-fallback");
  return v;
}

// `torus head`'s own: no HTTP surface unless --dashboard-port says so.
void SetDashboardFromDaemon(const Args& a, HeadConfig* cfg) {
  cfg->dashboard_host = a.Get("dashboard-host", "127.0.0.1");
  cfg->dashboard_port = OptionalPortFlag(a, "dashboard-port", -1);
  cfg->dashboard_port_fallback = a.Has("dashboard-port-fallback");
}


// How to reach the HTTP surface, for the start message ("" without one).
std::string DashboardNote(const std::string& session) {
  auto d = ReadFile(session + "/dashboard_address");
  if (!d.ok() || d->empty()) return "";
  return "\n  dashboard and Ray's Jobs API: http://" + *d + "  (token: " + session +
         "/token)\n    ray job CLI: RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(cat " + session +
         "/token) ray job submit --address http://" + *d + " -- CMD";
}

}  // namespace

Status WriteHeadAddresses(const Head& head, const std::string& session) {
  if (!session.empty()) {
    // The dashboard's address first, so that it is there once head_address is.
    std::error_code ec;
    if (head.dashboard_address().empty()) std::filesystem::remove(session + "/dashboard_address", ec);
    else if (auto s = WriteFile(session + "/dashboard_address", head.dashboard_address()); !s.ok()) return s;
    if (auto s = WriteFile(session + "/head_address", head.address()); !s.ok()) return s;
  }
  ReportDaemonStarted(head.address());
  return Status::Ok();
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
  cfg.listen_host = a.Get("listen-host", "");
  cfg.port = PortFlag(a, "port", kDefaultPort);
  // First: every failure after this reaches the command that started this head.
  if (a.Has("ready-fd")) SetDaemonReportFd(PositiveIntFlag(a, "ready-fd", -1));
  cfg.session_dir = a.Get("session-dir");
  if (!cfg.session_dir.empty()) cfg.state_path = HeadStore::PathIn(cfg.session_dir);
  if (a.Has("state")) cfg.state_path = a.Get("state");
  SetHeadTuning(a, &cfg);
  SetDashboardFromDaemon(a, &cfg);
  auto tok = FindToken(cfg.session_dir);
  if (!tok.ok()) Die(tok.status().message());
  cfg.token = *tok;
  if (HeadStore::IsEtcd(cfg.state_path)) return RunHeadOnEtcd(a, cfg, set);
  Head head(cfg);
  if (auto s = head.Start(); !s.ok()) Die(s.ToString());
  if (auto s = WriteHeadAddresses(head, cfg.session_dir); !s.ok()) {
    head.Stop();
    Die(s.message());
  }
  SignalThread signals(set, [&] { head.Stop(); });
  head.Wait();
  return 0;
}

namespace {

// --object-store-memory BYTES (Ray's flag): the node's object store size; 0 when not given.
StatusOr<uint64_t> ObjectStoreBytes(const Args& a) {
  if (!a.Has("object-store-memory")) return uint64_t{0};
  const std::string v = a.Get("object-store-memory");
  char* end = nullptr;
  errno = 0;
  unsigned long long bytes = std::strtoull(v.c_str(), &end, 10);
  if (v.empty() || v[0] == '-' || *end != '\0' || errno != 0 || bytes < (1ull << 20)) {
    return InvalidArgument("--object-store-memory: '" + v + "' is not a byte count of at least 1 MiB");
  }
  return uint64_t{bytes};
}

// --object-spilling-directory DIR (Ray's flag) or --spill-dir DIR: where a full object store
// spills; "" = the node's default (docs/object_store.md). Made absolute against this cwd.
std::string SpillDir(const Args& a) {
  std::string d = a.Get("object-spilling-directory", a.Get("spill-dir"));
  if (d.empty()) return d;
  std::error_code ec;
  auto abs = std::filesystem::absolute(d, ec);
  return ec ? d : abs.lexically_normal().string();
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
  auto store = ObjectStoreBytes(a);
  if (!store.ok()) return store.status();
  cfg.object_store_bytes = *store;
  cfg.spill_dir = SpillDir(a);
  // The agent's HTTP surface: --dashboard-agent-listen-port (Ray's flag; -1 = none).
  cfg.agent_host = a.Get("dashboard-agent-host", cfg.bind_host);
  cfg.agent_port = OptionalPortFlag(a, "dashboard-agent-listen-port", -1);
  cfg.agent_port_fallback = a.Has("dashboard-agent-port-fallback");
  cfg.serve_session_logs = a.Has("serve-session-logs");
  cfg.torus_exe = SelfExecutable();
  auto tok = FindToken(cfg.session_dir);
  if (!tok.ok()) return tok.status();
  cfg.token = *tok;
  return cfg;
}

}  // namespace

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

namespace {

pid_t SpawnDaemon(const std::string& session, const std::string& name,
                  const std::vector<std::string>& argv) {
  auto pid = SpawnSessionDaemon(session, name, argv);
  if (!pid.ok()) Die(pid.status().message());
  return *pid;
}

// A head or node run in the foreground (`--block`, as KubeRay runs `ray start`) is one of its
// session's daemons while it runs: its pid file lets `torus stop` (`ray stop`) stop it, and a
// second head refuse to start over it.
class ForegroundPidFile {
 public:
  ForegroundPidFile(const std::string& session, const std::string& name)
      : path_(session + "/pids/" + name + ".pid") {
    if (auto s = WriteSessionPidFile(session, name, getpid()); !s.ok()) {
      std::cerr << "torus: " << s.message() << " (torus stop will not find this process)" << std::endl;
    }
  }
  ~ForegroundPidFile() {
    std::error_code ec;
    std::filesystem::remove(path_, ec);
  }
  ForegroundPidFile(const ForegroundPidFile&) = delete;
  ForegroundPidFile& operator=(const ForegroundPidFile&) = delete;

 private:
  std::string path_;
};

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
  // The agent on Ray's port 52365 (another when taken), or the port given (strict).
  std::vector<std::string> v = {"--dashboard-agent-listen-port",
                                std::to_string(OptionalPortFlag(a, "dashboard-agent-listen-port", 52365))};
  if (!a.Has("dashboard-agent-listen-port")) v.push_back("--dashboard-agent-port-fallback");
  for (const char* k : {"num-cpus", "num-gpus", "memory", "resources", "labels", "bind", "heartbeat-ms",
                        "head-lost-ms", "object-store-memory", "dashboard-agent-host"}) {
    if (a.Has(k)) {
      v.push_back(std::string("--") + k);
      v.push_back(a.Get(k));
    }
  }
  if (std::string d = SpillDir(a); !d.empty()) {
    v.push_back("--object-spilling-directory");
    v.push_back(d);
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
  hc.listen_host = a.Get("listen-host", "");
  hc.port = port;
  hc.session_dir = session;
  hc.state_path = HeadStore::PathIn(session);
  auto tok = FindToken(session);
  if (!tok.ok()) Die(tok.status().message());
  hc.token = *tok;
  SetHeadTuning(a, &hc);
  SetDashboardFromStart(a, &hc);
  Head head(hc);
  if (auto s = head.Start(); !s.ok()) Die(s.ToString());
  ForegroundPidFile pid_file(session, "head");
  if (auto s = WriteHeadAddresses(head, session); !s.ok()) {
    head.Stop();
    Die(s.message());
  }
  Args na = a;
  na.flags["address"] = head.address();
  na.flags["session-dir"] = session;
  if (!na.Has("dashboard-agent-listen-port")) {
    na.flags["dashboard-agent-listen-port"] = "52365";
    na.flags["dashboard-agent-port-fallback"] = "true";
  }
  auto nc = NodeConfigFromArgs(na);
  if (!nc.ok()) Die(nc.status().message());
  nc->serve_session_logs = true;
  Node node(*nc);
  if (auto s = node.Start(); !s.ok()) Die(s.ToString());
  if (auto s = MakeLatestSession(session); !s.ok()) Die(s.message());
  std::cout << "Torus head running at " << head.address() << " (session " << session << ")"
            << DashboardNote(session) << "\n  Ctrl-C stops it." << std::endl;
  int sig;
  sigwait(&set, &sig);
  node.Stop();
  head.Stop();
  return 0;
}

// Where the head's client port listens: --listen-host, else --bind.
std::string HeadListenHost(const Args& a) { return a.Get("listen-host", a.Get("bind", "127.0.0.1")); }

// The command line of the head daemon `torus start --head` spawns.
std::vector<std::string> HeadDaemonArgs(const Args& a, const std::string& self, const std::string& port,
                                        const std::string& session) {
  std::vector<std::string> hargs = {self, "head", "--port", port, "--session-dir", session};
  for (const char* k : {"bind", "listen-host", "state"}) {
    if (!a.Has(k)) continue;
    hargs.push_back(std::string("--") + k);
    hargs.push_back(a.Get(k));
  }
  for (const auto& f : kHeadTuningFlags) {
    if (!a.Has(f.name)) continue;
    (void)PositiveIntFlag(a, f.name, 1);  // a bad value dies here, not in the head's log
    hargs.push_back(std::string("--") + f.name);
    hargs.push_back(a.Get(f.name));
  }
  HeadConfig dash;
  SetDashboardFromStart(a, &dash);
  for (auto& v : DashboardDaemonArgs(dash)) hargs.push_back(std::move(v));
  return hargs;
}

// `torus start --head` without --block: head and node daemons of a new session.
int SpawnHeadAndNode(const Args& a, const std::string& self, const std::string& session,
                     const std::string& port, bool resumed) {
  // The session's records (a resumed session's head_address) stay as they are until the new
  // head has written its own: a head that fails leaves the session resumable.
  bool node_live = false;  // a resumed session's own node rode out the head's absence
  for (const auto& d : LiveDaemons(session)) node_live |= std::filesystem::path(d.file).stem() == "node-head";
  int report = -1;
  auto hp = SpawnReportingSessionDaemon(session, "head", HeadDaemonArgs(a, self, port, session), &report);
  if (!hp.ok()) Die(hp.status().message() + "; nothing was started");
  // Its address once it serves, or its own error (a full disk, a damaged state) when it cannot.
  auto started = WaitForDaemonReport(report, *hp, session + "/logs/head.err", std::chrono::seconds(10));
  close(report);
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
  if (!started.ok()) fail("the head failed to start on port " + port + ": " + started.status().message());
  const std::string address = *started;
  std::vector<std::string> nargs = {self, "node", "--address", address, "--session-dir", session,
                                    "--serve-session-logs"};
  for (auto& s : NodeArgs(a)) nargs.push_back(s);
  if (!node_live) SpawnDaemon(session, "node-head", nargs);
  auto token = FindToken(session);
  if (!token.ok()) fail(token.status().message());
  if (!WaitForNodes(address, *token, 1, 10000)) fail("the head's node did not register within 10 s");
  if (auto s = MakeLatestSession(session); !s.ok()) fail(s.message());
  std::cout << "Torus head " << (resumed ? "resumed" : "started") << " at " << address << "\n  session: " << session
            << "\n  join another node: torus start --address " << address
            << "\n  drivers connect with TORUS_ADDRESS=" << address << " (or RAY_ADDRESS)" << DashboardNote(session)
            << "\n  stop: torus stop" << std::endl;
  return 0;
}

// The session a head on etcd runs in: the latest one when it belongs to this cluster (its token
// is the one etcd keeps: a standby on the active head's machine, or a head restarted), else a new
// one that takes etcd's token.
std::string EtcdHeadSession(const std::optional<EtcdKv>& token) {
  auto latest = FindLatestSession();
  if (token && latest.ok() && !latest->empty()) {
    auto t = FindToken(*latest);
    if (t.ok() && *t == token->value) return *latest;
  }
  auto session = CreateSession(/*make_latest=*/false);
  if (!session.ok()) Die(session.status().message());
  if (token) {
    if (auto s = WriteFile(*session + "/token", token->value, 0600); !s.ok()) Die(s.message());
  }
  return *session;
}

// `torus start --head --state etcd://HOST:PORT[,HOST:PORT...][/prefix]` (docs/fault_tolerance.md "Standby
// heads"): with no active head, a head (resuming what etcd holds) and this host's node, as
// without etcd; with one, a standby head alone, and this returns once it stands by.
int StartHeadOnEtcd(const Args& a, const std::string& self) {
  const std::string url = a.Get("state");
  auto parsed = ParseEtcdUrl(url);
  if (!parsed.ok()) Die("--state: " + parsed.status().message());
  auto client = EtcdClient::Connect(parsed->endpoint, 3000);
  if (!client.ok()) Die("--state " + url + ": " + client.status().message() + "; nothing was started");
  auto token = (*client)->Get(parsed->prefix + "/token");
  auto leader = (*client)->Get(parsed->prefix + "/leader");
  if (!token.ok() || !leader.ok()) Die("--state " + url + ": " + (token.ok() ? leader : token).status().message());
  const int port = PortFlag(a, "port", kDefaultPort);
  if (port == 0) Die("a head on etcd needs a fixed --port (its standbys' callers dial it)");
  const std::string p = std::to_string(port);
  if (std::string why = WhyCannotListen(HeadListenHost(a), port); !why.empty()) {
    Die("cannot start the head on port " + p + ": " + why + "; nothing was started");
  }
  const std::string session = EtcdHeadSession(*token);
  const std::string address = a.Get("bind", "127.0.0.1") + ":" + p;
  // The leader key of a head that died at this very address (a restart): it goes with its
  // lease within the TTL, and this head takes over then.
  if (!*leader || (*leader)->value == address) {
    auto store = HeadStore::Open(url);
    size_t records = 0;
    for (StoreKind k : kRecordKinds) {
      auto n = store.ok() ? (*store)->Count(k) : StatusOr<size_t>(store.status());
      if (n.ok()) records += *n;
    }
    if (records) std::cerr << "torus: resuming the cluster's state in " << url << std::endl;
    return SpawnHeadAndNode(a, self, session, p, /*resumed=*/records > 0);
  }
  const std::string state_file = HeadStateFile(session, port);
  std::error_code ec;
  std::filesystem::remove(state_file, ec);
  pid_t hp = SpawnDaemon(session, "head-" + p, HeadDaemonArgs(a, self, p, session));
  StatusOr<std::string> state = NotFound("");
  for (int i = 0; i < 1000 && !state.ok(); ++i) {
    state = ReadFile(state_file);
    if (state.ok()) break;
    int status = 0;
    if (waitpid(hp, &status, WNOHANG) == hp) {
      auto log = ReadFile(session + "/logs/head-" + p + ".err");
      Die("the standby head failed to start on port " + p + ":\n" + (log.ok() ? *log : std::string()));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (!state.ok()) Die("the standby head did not report within 10 s; see " + session + "/logs/head-" + p + ".err");
  if (*state == "active") {
    std::cout << "Torus head started at " << address << " (the active head; state " << url << ")" << std::endl;
  } else {
    std::cout << "Torus head standing by at " << address << " (state " << url << ")\n  active head: "
              << state->substr(state->find(' ') + 1) << "; this one takes over when it is gone"
              << "\n  callers of " << address << " reach the active head" << std::endl;
  }
  return 0;
}

int StartHead(const Args& a, const std::string& self) {
  if (auto s = CheckSessionRoot(); !s.ok()) Die(s.message());
  if (a.Has("state") && !HeadStore::IsEtcd(a.Get("state"))) {
    Die("--state " + a.Get("state") + ": give etcd://HOST:PORT[,HOST:PORT...][/prefix] (without --state the head keeps its "
        "state in its session directory)");
  }
  if (HeadStore::IsEtcd(a.Get("state"))) return StartHeadOnEtcd(a, self);
  auto resume = ChooseHeadSession(a);
  if (!resume.ok()) Die(resume.status().message());
  if (resume->empty()) RefuseIfClusterRunning();
  std::string port = std::to_string(PortFlag(a, "port", kDefaultPort));
  if (port != "0") {
    // Before anything is created: a port in use is refused, never shared.
    std::string why = WhyCannotListen(HeadListenHost(a), std::stoi(port));
    if (!why.empty()) Die("cannot start the head on port " + port + ": " + why + "; nothing was started");
  }
  if (a.Has("dashboard-port") && PortFlag(a, "dashboard-port", 0) != 0) {
    int dport = PortFlag(a, "dashboard-port", 0);
    std::string why = WhyCannotListen(a.Get("dashboard-host", "127.0.0.1"), dport);
    if (!why.empty()) {
      Die("cannot serve the dashboard on port " + std::to_string(dport) + ": " + why + "; nothing was started");
    }
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
// Waits until the node daemon `pid` of this host is alive at the head. (Not a count of alive
// nodes: a node killed just before this one started may be declared dead meanwhile.)
bool WaitForNodePid(const std::string& address, const std::string& token, pid_t pid, int timeout_ms) {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto stub = rpc::Head::NewStub(GetChannel(address));
  while (std::chrono::steady_clock::now() < deadline) {
    rpc::ListReply reply;
    auto ctx = NewContext(token, 1000);
    if (stub->List(ctx.get(), rpc::Empty(), &reply).ok()) {
      for (const auto& n : reply.nodes()) {
        if (n.alive() && n.pid() == pid && n.hostname() == host) return true;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
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
  // The node gets every head given.
  const std::string heads = address;
  address = FirstReachable(heads);
  {
    rpc::ListReply reply;
    auto ctx = NewContext(*token, 5000);
    auto st = rpc::Head::NewStub(GetChannel(address))->List(ctx.get(), rpc::Empty(), &reply);
    if (!st.ok()) Die("cannot reach the head at " + address + ": " + st.error_message());
  }
  std::vector<std::string> nargs = {self, "node", "--address", heads, "--session-dir", session};
  for (auto& s : NodeArgs(a)) nargs.push_back(s);
  if (a.Has("block")) {
    std::vector<char*> cargv;
    for (auto& s : nargs) cargv.push_back(s.data());
    ForegroundPidFile pid_file(session, "node-" + std::to_string(getpid()));
    return RunNode(ParseArgs(static_cast<int>(cargv.size()), cargv.data(), 2, kBoolFlags));
  }
  static int counter = 0;
  std::string name = "node-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
  const pid_t pid = SpawnDaemon(session, name, nargs);
  if (!WaitForNodePid(address, *token, pid, 10000)) {
    auto log = ReadFile(session + "/logs/" + name + ".err");
    Die("the node did not register within 10 s:\n" + (log.ok() ? *log : std::string()));
  }
  std::cout << "Torus node joined the cluster at " << address << std::endl;
  return 0;
}

}  // namespace

int Start(const Args& a) {
  std::string self = SelfExecutable();
  // Bad values die here, before anything is spawned.
  (void)OptionalPortFlag(a, "dashboard-agent-listen-port", 52365);
  if (a.Has("dashboard-port")) (void)PortFlag(a, "dashboard-port", 0);
  if (auto r = ParseResources(a); !r.ok()) Die(r.status().message());
  if (auto l = ParseLabels(a.Get("labels")); !l.ok()) Die(l.status().message());
  if (auto s = ObjectStoreBytes(a); !s.ok()) Die(s.status().message());
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

std::vector<std::string> StartFlags() {
  std::vector<std::string> v = {"head", "address", "port", "num-cpus", "num-gpus", "memory", "resources",
                                "labels", "bind", "listen-host", "block", "heartbeat-ms", "head-lost-ms", "new-session",
                                "session-dir", "help", "dashboard-host", "dashboard-port", "include-dashboard",
                                "dashboard-agent-listen-port", "dashboard-agent-host", "object-store-memory",
                                "object-spilling-directory", "spill-dir", "state"};
  for (const auto& f : kHeadTuningFlags) v.push_back(f.name);
  return v;
}

}  // namespace torus
