// The cluster launcher's process orchestration (docs/launcher.md): `torus up`, `torus down` and
// the supervisor. The manifest model, validation and environment live in launcher/manifest.h.
//
// State of a launched cluster lives in its session directory, so that `down` works after any
// crash (of `up`, of the supervisor, of nodes):
//   launcher/state.json   the plan: hosts, their env, addresses, network namespaces, bridge
//   launcher/hosts        the host table ("<ip> <fqdn> <name>"), also /etc/netns/<ns>/hosts
//   launcher/down         written by `down` once everything is gone
//   pids/head.pid, pids/supervisor.pid, pids/node-<host>.pid
// Every process started for the cluster (head, supervisor, nodes, and through the nodes the
// workers) carries TORUS_UP_SESSION=<session dir> in its environment; `down` finds them by it.
//
// THREADS: all three commands are single-threaded, apart from gRPC's own threads in `up` (head
// queries). The supervisor never uses gRPC: it blocks SIGCHLD/SIGTERM/SIGINT and handles them
// with sigtimedwait() in its one loop.
#include "cli/up.h"

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/flags.h"
#include "common/ids.h"
#include "common/json_limits.h"
#include "common/labels.h"
#include "common/process.h"
#include "common/rpc.h"
#include "common/session.h"
#include "common/session_daemons.h"
#include "common/shm.h"
#include "common/shm_owner.h"
#include "launcher/cluster_processes.h"
#include "launcher/host_budget.h"
#include "launcher/manifest.h"
#include "launcher/netns.h"
#include "proto/torus.grpc.pb.h"

extern char** environ;

namespace torus {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using launcher::Alive;
using launcher::HasEnvEntry;
using launcher::HasLeftovers;
using launcher::HostsTable;
using launcher::IpBinary;
using launcher::kMarkerVar;
using launcher::Marker;
using launcher::PickSubnet;
using launcher::ReadPid;
using launcher::SessionProcesses;
using launcher::ShmPrefixes;
using launcher::SetUpNetns;
using launcher::TearDownNetns;
using launcher::TerminateAll;
using launcher::Trim;

// ------------------------------------------------------------------------------- small helpers

using Flags = Args;

// The flags of up/down/supervise that take no value.
const std::set<std::string> kUpBoolFlags = {"wait", "netns", "no-atomic-restart", "help"};

// ------------------------------------------------------------------------------- state

std::string StatePath(const std::string& session) { return session + "/launcher/state.json"; }

StatusOr<json> ReadState(const std::string& session) {
  auto r = ReadFile(StatePath(session));
  if (!r.ok()) return r.status();
  auto j = ParseJson(*r, StatePath(session));
  if (!j.ok()) return Internal(j.status().message());
  if (!j->is_object()) return Internal(StatePath(session) + " is not a JSON object");
  return std::move(*j);
}

Status WriteState(const std::string& session, const json& state) {
  return WriteFile(StatePath(session), state.dump(2));
}

std::string LabelsFlag(const json& labels) {
  std::string s;
  for (auto& [k, v] : labels.items()) s += (s.empty() ? "" : ",") + k + "=" + v.get<std::string>();
  return s;
}

// ------------------------------------------------------------------------------- supervisor

struct SupHost {
  json spec;
  std::string name;
  std::string replica_key;  // "G-r"
  pid_t pid = 0;
  Clock::time_point started_at{};
  Clock::time_point restart_at{};  // pending restart when != {}
  // Delay before a restart: 300 ms, doubled (to at most 10 s) each time the host exits within
  // 5 s of its start, so a host that cannot start does not spin.
  std::chrono::milliseconds backoff{300};
};

struct Supervisor {
  std::string session, self, head_address, policy, ip;
  pid_t head_pid = 0;
  std::vector<SupHost> hosts;
  std::map<std::string, Clock::time_point> stopping;  // replica -> SIGKILL deadline

  void Log(const std::string& msg) {
    auto t = std::time(nullptr);
    char buf[32];
    strftime(buf, sizeof buf, "%H:%M:%S", localtime(&t));
    std::cerr << buf << " supervisor: " << msg << std::endl;
  }

  Status Spawn(SupHost& h) {
    const json& s = h.spec;
    std::vector<std::string> argv;
    std::string ns = s.value("netns", "");
    if (!ns.empty()) {
      // Its own network namespace and, like a pod, its own host name (UTS namespace): programs
      // that find their address from gethostname() (gloo under jax.distributed) resolve it, via
      // the namespace's hosts file, to this host's address rather than a shared loopback one.
      argv = {ip, "netns", "exec", ns, "unshare", "--uts", "sh", "-c", "hostname \"$0\" && exec \"$@\"",
              s.value("name", std::string("host"))};
    }
    std::vector<std::string> node = {self, "node", "--address", head_address, "--session-dir", session,
                                     "--bind", s["ip"].get<std::string>(), "--resources", s["resources"].dump(),
                                     "--dashboard-agent-listen-port", "52365", "--dashboard-agent-port-fallback"};
    if (s.value("is_head", false)) node.push_back("--serve-session-logs");
    if (uint64_t b = s.value("object_store_bytes", uint64_t{0}); b > 0) {
      node.push_back("--object-store-memory");
      node.push_back(std::to_string(b));
    }
    argv.insert(argv.end(), node.begin(), node.end());
    // The group travels as --node-group: the node sets that reserved label itself.
    json labels = s["labels"];
    const std::string group_key(kLabelNodeGroup);
    if (labels.contains(group_key)) {
      argv.push_back("--node-group");
      argv.push_back(labels[group_key].get<std::string>());
      labels.erase(group_key);
    }
    if (!labels.empty()) {
      argv.push_back("--labels");
      argv.push_back(LabelsFlag(labels));
    }
    SpawnOptions o;
    o.argv = argv;
    // A fresh pod: no TPU identity inherited from whoever ran `torus up`.
    for (char** e = environ; *e; ++e) {
      std::string kv = *e;
      std::string k = kv.substr(0, kv.find('='));
      if (k.rfind("TPU_", 0) == 0 || k.rfind("MEGASCALE_", 0) == 0 || k.rfind("TORUS_TPU_", 0) == 0 ||
          k == "TORUS_ADDRESS" || k == "RAY_ADDRESS") {
        o.env_unset.push_back(k);
      }
    }
    for (auto& [k, v] : s["env"].items()) o.env_set[k] = v.get<std::string>();
    o.env_set[kMarkerVar] = session;
    // Every simulated host runs on this machine: their arenas share its RAM and /dev/shm.
    o.env_set["TORUS_HOST_NODES"] = std::to_string(hosts.size());
    o.stdout_path = session + "/logs/node-" + h.name + ".out";
    o.stderr_path = session + "/logs/node-" + h.name + ".err";
    auto pid = torus::Spawn(o);
    if (!pid.ok()) return pid.status();
    h.pid = *pid;
    h.started_at = Clock::now();
    h.restart_at = {};
    return WriteFile(session + "/pids/node-" + h.name + ".pid", PidFileContent(h.pid));
  }

  void OnExit(size_t i, int status) {
    SupHost& h = hosts[i];
    Log("host " + h.name + " (pid " + std::to_string(h.pid) + ") " + DescribeWaitStatus(status));
    h.pid = 0;
    const bool quick = Clock::now() - h.started_at < std::chrono::seconds(5);
    h.backoff = quick ? std::min(h.backoff * 2, std::chrono::milliseconds(10000)) : std::chrono::milliseconds(300);
    std::error_code ec;
    fs::remove(session + "/pids/node-" + h.name + ".pid", ec);
    if (policy == "none") return;
    int replica_hosts = h.spec.value("replica_hosts", 1);
    if (policy == "single" || replica_hosts <= 1 || h.spec.value("is_head", false)) {
      h.restart_at = Clock::now() + h.backoff;
      return;
    }
    if (stopping.count(h.replica_key)) return;  // already restarting this replica
    Log("replica " + h.replica_key + " lost a host: stopping its other hosts, then restarting all " +
        std::to_string(replica_hosts));
    stopping[h.replica_key] = Clock::now() + std::chrono::seconds(5);
    for (auto& o : hosts) {
      if (o.replica_key == h.replica_key && o.pid > 0) kill(o.pid, SIGTERM);
    }
  }

  // Restarts replicas whose hosts are all down; SIGKILLs hosts that ignore SIGTERM.
  void Tick() {
    auto now = Clock::now();
    for (auto it = stopping.begin(); it != stopping.end();) {
      bool any = false;
      for (auto& o : hosts) {
        if (o.replica_key != it->first || o.pid <= 0) continue;
        any = true;
        if (now > it->second) kill(o.pid, SIGKILL);
      }
      if (!any) {
        auto delay = std::chrono::milliseconds(300);
        for (auto& o : hosts) {
          if (o.replica_key == it->first) delay = std::max(delay, o.backoff);
        }
        Log("restarting replica " + it->first + " in " + std::to_string(delay.count()) + " ms");
        for (auto& o : hosts) {
          if (o.replica_key == it->first) o.restart_at = now + delay;
        }
        it = stopping.erase(it);
      } else {
        ++it;
      }
    }
    for (auto& h : hosts) {
      if (h.pid == 0 && h.restart_at != Clock::time_point{} && now >= h.restart_at) {
        if (auto s = Spawn(h); !s.ok()) {
          Log("cannot restart " + h.name + ": " + s.ToString());
          h.restart_at = now + std::chrono::seconds(1);
        } else {
          Log("restarted " + h.name + " as pid " + std::to_string(h.pid));
        }
      }
    }
  }

  void StopAll() {
    std::vector<pid_t> pids;
    for (auto& h : hosts) {
      if (h.pid > 0) pids.push_back(h.pid);
    }
    TerminateAll(pids, std::chrono::seconds(5));
    for (auto& h : hosts) {
      std::error_code ec;
      fs::remove(session + "/pids/node-" + h.name + ".pid", ec);
    }
  }
};

int RunSupervise(const Flags& f) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGCHLD);
  sigprocmask(SIG_BLOCK, &set, nullptr);
  Supervisor sup;
  sup.session = f.Get("session-dir");
  auto state = ReadState(sup.session);
  if (!state.ok()) Die("supervise: " + state.status().message());
  sup.self = SelfExecutable();
  sup.ip = IpBinary();
  sup.head_address = (*state)["head_address"];
  sup.policy = (*state).value("restart", "atomic");
  sup.head_pid = ReadPid(sup.session + "/pids/head.pid");
  for (const auto& h : (*state)["hosts"]) {
    SupHost sh;
    sh.spec = h;
    sh.name = h["name"];
    sh.replica_key = h["group"].get<std::string>() + "-" + std::to_string(h["replica"].get<int>());
    if (h.value("is_head", false)) sh.replica_key = "<head>";
    sup.hosts.push_back(std::move(sh));
  }
  for (auto& h : sup.hosts) {
    if (auto s = sup.Spawn(h); !s.ok()) {
      sup.Log("cannot start " + h.name + ": " + s.ToString());
      sup.StopAll();
      return 1;
    }
  }
  sup.Log("started " + std::to_string(sup.hosts.size()) + " node processes; restart policy " + sup.policy);
  timespec tick{0, 100 * 1000 * 1000};
  while (true) {
    int sig = sigtimedwait(&set, nullptr, &tick);
    if (sig == SIGTERM || sig == SIGINT) {
      sup.Log("stopping");
      sup.StopAll();
      return 0;
    }
    int status = 0;
    pid_t pid;
    while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
      for (size_t i = 0; i < sup.hosts.size(); ++i) {
        if (sup.hosts[i].pid == pid) sup.OnExit(i, status);
      }
    }
    if (sup.head_pid > 0 && !Alive(sup.head_pid)) {
      sup.Log("the head (pid " + std::to_string(sup.head_pid) + ") is gone; stopping every host");
      sup.StopAll();
      return 1;
    }
    // A stop request (`torus down`/`torus stop`) may already be pending: never restart then.
    sigset_t pending;
    sigpending(&pending);
    if (sigismember(&pending, SIGTERM) || sigismember(&pending, SIGINT)) continue;
    sup.Tick();
  }
}

// ------------------------------------------------------------------------------- down

// Sessions under the root that `torus up` started.
std::vector<std::string> UpSessions() {
  std::vector<std::string> out;
  std::error_code ec;
  for (const auto& s : fs::directory_iterator(SessionRoot(), ec)) {
    if (s.is_symlink() || !s.is_directory() || s.path().filename().string().rfind("session_", 0) != 0) continue;
    if (fs::exists(s.path() / "launcher" / "state.json")) out.push_back(s.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct DownReport {
  int processes = 0, segments = 0, namespaces = 0;
};

DownReport DownSession(const std::string& session) {
  DownReport r;
  auto state = ReadState(session);
  const std::string marker = Marker(session);
  pid_t sup = ReadPid(session + "/pids/supervisor.pid");
  if (sup > 0 && Alive(sup) && HasEnvEntry(sup, marker)) {
    r.processes += TerminateAll({sup}, std::chrono::seconds(8));
  }
  auto pids = SessionProcesses(session);
  auto prefixes = ShmPrefixes(session, pids);
  r.processes += TerminateAll(pids, std::chrono::seconds(5));
  // Until none is left: a node may spawn a worker while it stops, and on a loaded machine a
  // killed process takes a while to go (the owner lock of its segments is held until then).
  for (int round = 0; round < 5; ++round) {
    auto late = SessionProcesses(session);
    if (late.empty()) break;
    for (const auto& p : ShmPrefixes(session, late)) prefixes.insert(p);
    r.processes += TerminateAll(late, std::chrono::seconds(2));
  }
  for (const auto& p : ShmPrefixes(session, {})) prefixes.insert(p);
  for (const auto& p : prefixes) r.segments += UnlinkSegmentsWithPrefix(p);
  r.segments += CleanDeadNodeSegments(session);
  if (state.ok()) r.namespaces = TearDownNetns(session, *state);
  std::error_code ec;
  for (const auto& f : fs::directory_iterator(session + "/pids", ec)) fs::remove(f.path(), ec);
  if (auto s = WriteFile(session + "/launcher/down", ""); !s.ok()) std::cerr << "torus: " << s.message() << std::endl;
  return r;
}

int RunDown(const Flags& f) {
  std::vector<std::string> sessions;
  if (f.Has("session-dir")) {
    sessions.push_back(f.Get("session-dir"));
    if (!fs::exists(StatePath(sessions[0]))) Die(sessions[0] + " is not a session started by torus up");
  } else {
    for (const auto& s : UpSessions()) {
      // Cleaned sessions are skipped unless something of theirs is left (or alive again).
      if (fs::exists(s + "/launcher/down") && !HasLeftovers(s)) continue;
      sessions.push_back(s);
    }
  }
  if (sessions.empty()) {
    std::cout << "No cluster started by torus up is running (under " << SessionRoot() << ")." << std::endl;
    return 0;
  }
  for (const auto& s : sessions) {
    auto state = ReadState(s);
    std::string name = state.ok() ? state->value("cluster", "?") : "?";
    DownReport r = DownSession(s);
    std::cout << "Stopped cluster " << name << " (" << s << "): " << r.processes << " process(es), "
              << r.segments << " shared-memory segment(s), " << r.namespaces << " network namespace(s) removed."
              << std::endl;
  }
  return 0;
}

// ------------------------------------------------------------------------------- up

std::string LatestUpSession() {
  std::string s = LatestSession();
  if (!s.empty() && fs::exists(StatePath(s))) return s;
  auto all = UpSessions();
  for (auto it = all.rbegin(); it != all.rend(); ++it) {
    if (!fs::exists(*it + "/launcher/down")) return *it;
  }
  return "";
}

int KillHost(const Flags& f) {
  std::string session = f.Has("session-dir") ? f.Get("session-dir") : LatestUpSession();
  if (session.empty()) Die("no cluster started by torus up");
  std::string name = f.Get("kill-host");
  // `--kill-host G r j` as well as `--kill-host G-r-j`.
  if (f.positional.size() == 2) name += "-" + f.positional[0] + "-" + f.positional[1];
  pid_t pid = ReadPid(session + "/pids/node-" + name + ".pid");
  if (pid <= 0 || !Alive(pid) || !HasEnvEntry(pid, Marker(session))) {
    Die("host '" + name + "' has no running node process in " + session);
  }
  int sig = f.Get("signal", "KILL") == "TERM" ? SIGTERM : SIGKILL;
  if (kill(pid, sig) != 0) Die("cannot signal pid " + std::to_string(pid) + ": " + strerror(errno));
  std::cout << "Sent SIG" << (sig == SIGKILL ? "KILL" : "TERM") << " to host " << name << " (pid " << pid << ")"
            << std::endl;
  return 0;
}

void Usage() {
  std::cout << "usage: torus up FILE.yaml [--wait] [--timeout S] [--port N] [--netns] [--no-atomic-restart]\n"
               "                     [--max-hosts N]\n"
               "       torus up --kill-host G-r-j [--signal KILL|TERM] [--session-dir D]\n"
               "       torus down [--session-dir D]\n";
}

// Polls the head until `want` hosts of the plan are registered (or the deadline), printing one
// line per host as it registers. Returns how many are registered.
size_t WatchRegistration(const std::string& session, const json& state, const std::string& address,
                         const std::string& token, Clock::time_point deadline, bool print) {
  auto stub = rpc::Head::NewStub(GetChannel(address));
  std::set<std::string> seen;
  const size_t want = state["hosts"].size();
  while (true) {
    rpc::ListReply reply;
    auto ctx = NewContext(token, 2000);
    if (stub->List(ctx.get(), rpc::Empty(), &reply).ok()) {
      std::map<int64_t, const rpc::NodeRecord*> by_pid;
      for (const auto& n : reply.nodes()) {
        if (n.alive()) by_pid[n.pid()] = &n;
      }
      for (const auto& h : state["hosts"]) {
        std::string name = h["name"];
        if (seen.count(name)) continue;
        pid_t pid = ReadPid(session + "/pids/node-" + name + ".pid");
        auto it = by_pid.find(pid);
        if (pid <= 0 || it == by_pid.end()) continue;
        seen.insert(name);
        if (print) {
          std::cout << "  [" << seen.size() << "/" << want << "] " << name << " registered: node "
                    << it->second->node_id().substr(0, 12) << " at " << it->second->address() << std::endl;
        }
      }
    }
    if (seen.size() >= want || Clock::now() >= deadline) return seen.size();
    if (!Alive(ReadPid(session + "/pids/supervisor.pid"))) return seen.size();  // none will come
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The options of `torus up FILE.yaml`, checked.
struct UpOptions {
  std::string file;
  bool netns = false;
  bool wait = false;
  std::string restart;  // atomic, single or none
  int port = 0;
  double timeout_s = 120;
  launcher::HostLimit max_hosts;
};

UpOptions ParseUpOptions(const Flags& f) {
  UpOptions o;
  o.file = f.positional[0];
  o.wait = f.Has("wait");
  o.netns = f.Has("netns");
  if (o.netns) {
    if (geteuid() != 0) Die("--netns needs root (CAP_NET_ADMIN) to create network namespaces");
    if (IpBinary().empty()) Die("--netns needs the `ip` command (iproute2: apt-get install iproute2)");
  }
  o.restart = f.Has("no-atomic-restart") ? "single" : f.Get("restart", "atomic");
  if (o.restart != "atomic" && o.restart != "single" && o.restart != "none") {
    Die("--restart must be atomic, single or none, got '" + o.restart + "'");
  }
  try {
    o.port = std::stoi(f.Get("port", "0"));
  } catch (...) {
    Die("--port must be a number");
  }
  try {
    o.timeout_s = std::stod(f.Get("timeout", "120"));
  } catch (...) {
    Die("--timeout must be a number of seconds");
  }
  const char* env = getenv("TORUS_MAX_HOSTS");
  auto limit = launcher::ResolveHostLimit(f.Has("max-hosts") ? std::optional(f.Get("max-hosts")) : std::nullopt,
                                          env && *env ? std::optional<std::string>(env) : std::nullopt,
                                          launcher::ReadMachineRoom());
  if (!limit.ok()) Die(limit.status().message());
  o.max_hosts = *limit;
  return o;
}

// Dies unless the plan fits this machine: before a session exists or anything starts.
void RefusePlanTooLarge(const std::vector<launcher::HostPlan>& plan, const UpOptions& o) {
  if (auto s = launcher::CheckHostCount(plan.size(), o.max_hosts); !s.ok()) Die(s.message());
  if (o.netns && plan.size() > 250) {
    Die("--netns supports at most 250 hosts in one /24, the plan has " + std::to_string(plan.size()) +
        "; nothing was started");
  }
}

// The manifest `file`, parsed; death naming the file when it cannot be read or is invalid.
launcher::ClusterSpec ReadManifest(const std::string& file) {
  auto text = ReadFile(file);
  if (!text.ok()) Die(text.status().message());
  auto spec = launcher::ParseRayCluster(*text);
  if (!spec.ok()) Die(file + ": " + spec.status().message());
  return *std::move(spec);
}

// The hosts of the plan as the state file records them, each with its address: the head on
// `head_ip`, the others in their network namespaces or on their own loopback address.
json HostsState(const std::vector<launcher::HostPlan>& plan, const json& state, bool netns) {
  json hosts = json::array();
  size_t k = 0;
  for (const auto& h : plan) {
    json j;
    j["name"] = h.name;
    j["fqdn"] = h.fqdn;
    j["group"] = h.group;
    j["replica"] = h.replica;
    j["host"] = h.host;
    j["replica_hosts"] = h.replica_hosts;
    j["is_head"] = h.is_head;
    j["tpu"] = h.tpu;
    j["env"] = h.env;
    j["resources"] = json::object();
    for (const auto& [rk, rv] : h.resources) j["resources"][rk] = rv;
    j["labels"] = h.labels;
    j["object_store_bytes"] = h.object_store_bytes;
    if (h.is_head) {
      j["ip"] = state["head_ip"];
      j["netns"] = "";
    } else if (netns) {
      j["ip"] = state["subnet"].get<std::string>() + "." + std::to_string(k + 2);
      j["netns"] = "torus-" + state["netns_id"].get<std::string>() + "-" + std::to_string(k);
      ++k;
    } else {
      // Each simulated host listens on its own loopback address (127.77.0.0/16).
      j["ip"] = "127.77." + std::to_string((k + 2) / 256) + "." + std::to_string((k + 2) % 256);
      j["netns"] = "";
      ++k;
    }
    hosts.push_back(j);
  }
  return hosts;
}

// The plan of the cluster as launcher/state.json records it, before anything starts.
json PlanState(const launcher::ClusterSpec& spec, const std::vector<launcher::HostPlan>& plan,
               const UpOptions& o, const std::string& session) {
  json state;
  state["cluster"] = spec.name;
  state["manifest"] = fs::absolute(o.file).string();
  state["session"] = session;
  state["netns"] = o.netns;
  state["restart"] = o.restart;
  std::string head_ip = "127.0.0.1";
  if (o.netns) {
    std::string id = RandomHex(3);
    state["netns_id"] = id;
    state["bridge"] = "tb" + id;
    state["subnet"] = PickSubnet();
    head_ip = state["subnet"].get<std::string>() + ".1";
  }
  state["head_ip"] = head_ip;
  state["hosts"] = HostsState(plan, state, o.netns);
  return state;
}

// Reports `msg`, removes whatever was started for `session` (processes, shared memory, pid
// files, namespaces; `launcher/down` marks it) and exits with status 1.
[[noreturn]] void FailUp(const std::string& session, const std::string& msg) {
  std::cerr << "torus: " << msg << "\n  cleaning up what was started..." << std::endl;
  DownReport r = DownSession(session);
  std::cerr << "  stopped " << r.processes << " process(es), removed " << r.segments << " shared-memory segment(s) and "
            << r.namespaces << " network namespace(s)" << std::endl;
  exit(1);
}

// Fails the launch when its supervisor has exited: it stopped every host it had started, and
// its last log line says why (a host it could not start).
void FailIfSupervisorGone(const std::string& session) {
  if (Alive(ReadPid(session + "/pids/supervisor.pid"))) return;
  const std::string log = session + "/logs/supervisor.err";
  std::string last;
  if (auto text = ReadFile(log); text.ok()) {
    std::istringstream lines(*text);
    for (std::string line; std::getline(lines, line);) {
      if (!Trim(line).empty()) last = Trim(line);
    }
  }
  FailUp(session, "the supervisor exited" + (last.empty() ? std::string() : " (" + last + ")") + "; see " + log);
}

// Spawns a daemon of the cluster (marked with the session, without the caller's cluster
// address) and writes its pid file; a failure fails the launch.
pid_t SpawnClusterDaemon(const std::string& session, const std::string& name,
                         const std::vector<std::string>& argv) {
  auto pid = SpawnSessionDaemon(session, name, argv, {{kMarkerVar, session}}, {"TORUS_ADDRESS", "RAY_ADDRESS"});
  if (!pid.ok()) FailUp(session, pid.status().message());
  return *pid;
}

// Starts the head and returns its address once it listens (up to 10 s), or fails the launch
// with the head's own error.
std::string StartClusterHead(const std::string& session, int port, const std::string& head_ip) {
  // The HTTP surface on Ray's port, as a KubeRay head has it (another when 8265 is taken).
  int report = -1;
  auto head = SpawnReportingSessionDaemon(session, "head",
                                          {SelfExecutable(), "head", "--port", std::to_string(port), "--session-dir",
                                           session, "--bind", head_ip, "--dashboard-host", head_ip,
                                           "--dashboard-port", "8265", "--dashboard-port-fallback"},
                                          &report, {{kMarkerVar, session}}, {"TORUS_ADDRESS", "RAY_ADDRESS"});
  if (!head.ok()) FailUp(session, head.status().message());
  auto address = WaitForDaemonReport(report, *head, session + "/logs/head.err", std::chrono::seconds(10));
  close(report);
  if (!address.ok()) FailUp(session, "the head failed to start: " + address.status().message());
  return *address;
}

// --wait: until every host has registered, or death naming those whose process is not running.
void WaitForAllHosts(const std::string& session, const json& state, const std::string& address,
                     const std::string& token, Clock::time_point deadline, const Flags& f) {
  const size_t want = state["hosts"].size();
  size_t n = WatchRegistration(session, state, address, token, deadline, true);
  if (n >= want) return;
  FailIfSupervisorGone(session);
  std::string missing;
  for (const auto& h : state["hosts"]) {
    pid_t pid = ReadPid(session + "/pids/node-" + h["name"].get<std::string>() + ".pid");
    if (pid <= 0 || !Alive(pid)) missing += " " + h["name"].get<std::string>();
  }
  Die(std::to_string(n) + " of " + std::to_string(want) + " hosts registered within " +
      f.Get("timeout", "120") + " s" + (missing.empty() ? "" : "; not running:" + missing) + "; see " +
      session + "/logs (the cluster is left up; `torus down` stops it)");
}

// Without --wait: only until the supervisor has started every node process.
void WaitForNodeProcesses(const std::string& session, const json& state, const std::string& address,
                          const std::string& token, Clock::time_point deadline) {
  bool all = false;
  while (!all && Clock::now() < deadline) {
    all = true;
    for (const auto& h : state["hosts"]) {
      if (ReadPid(session + "/pids/node-" + h["name"].get<std::string>() + ".pid") <= 0) all = false;
    }
    if (!all) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (!all) FailIfSupervisorGone(session);
  }
  size_t n = WatchRegistration(session, state, address, token, Clock::now(), true);
  std::cout << "  " << state["hosts"].size() << " node processes started, " << n
            << " registered so far (`torus up --wait` waits for all)" << std::endl;
}

// The session of a new cluster with its plan written, its network set up when asked.
std::string PrepareSession(const launcher::ClusterSpec& spec, const std::vector<launcher::HostPlan>& plan,
                           const UpOptions& o, json* state) {
  auto session_or = CreateSession(true);
  if (!session_or.ok()) Die(session_or.status().message());
  const std::string session = *session_or;
  fs::create_directories(session + "/launcher");
  fs::create_directories(session + "/pids");
  *state = PlanState(spec, plan, o, session);
  if (auto s = WriteState(session, *state); !s.ok()) Die(s.message());
  if (auto s = WriteFile(session + "/launcher/hosts", HostsTable(*state)); !s.ok()) FailUp(session, s.message());
  std::cout << "Launching cluster " << spec.name << ": " << plan.size() << " node processes (session "
            << session << ")" << std::endl;
  if (o.netns) {
    auto t = Clock::now();
    if (auto s = SetUpNetns(session, *state); !s.ok()) FailUp(session, "network namespaces: " + s.message());
    std::cout << "  " << (plan.size() - 1) << " network namespaces on bridge " << (*state)["bridge"].get<std::string>()
              << " (" << (*state)["subnet"].get<std::string>() << ".0/24) in "
              << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t).count() << " ms"
              << std::endl;
  }
  return session;
}

int RunUp(const Flags& f) {
  if (f.Has("help")) {
    Usage();
    return 0;
  }
  if (f.Has("kill-host")) return KillHost(f);
  if (f.positional.size() != 1) {
    Usage();
    return 2;
  }
  const auto t0 = Clock::now();
  auto spec = ReadManifest(f.positional[0]);
  const UpOptions o = ParseUpOptions(f);
  if (!spec.ignored_fields.empty()) {
    std::string list;
    for (const auto& p : spec.ignored_fields) list += (list.empty() ? "" : ", ") + p;
    std::cout << "Ignoring fields Torus does not use: " << list << std::endl;
  }
  auto plan = launcher::PlanHosts(spec);
  RefusePlanTooLarge(plan, o);
  json state;
  const std::string session = PrepareSession(spec, plan, o, &state);
  const std::string head_ip = state["head_ip"];
  const std::string address = StartClusterHead(session, o.port, head_ip);
  state["head_address"] = address;
  if (auto s = WriteState(session, state); !s.ok()) FailUp(session, s.message());
  auto token = FindToken(session);
  if (!token.ok()) FailUp(session, token.status().message());
  // The supervisor starts and watches every node process.
  SpawnClusterDaemon(session, "supervisor", {SelfExecutable(), "supervise", "--session-dir", session});
  const auto deadline = t0 + std::chrono::milliseconds(static_cast<int64_t>(o.timeout_s * 1000));
  if (o.wait) WaitForAllHosts(session, state, address, *token, deadline, f);
  else WaitForNodeProcesses(session, state, address, *token, deadline);
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  std::cout << "Cluster " << spec.name << " is up" << (o.wait ? "" : " (starting)") << " after " << secs
            << " s\n  address: " << address << "\n  session: " << session << "\n  hosts:   " << session
            << "/launcher/hosts\n  drivers: TORUS_ADDRESS=" << address;
  if (o.netns) std::cout << " TORUS_BIND_HOST=" << head_ip;
  if (auto d = ReadFile(session + "/dashboard_address"); d.ok() && !d->empty()) {
    std::cout << "\n  jobs:    ray job submit --address http://" << *d << " (RAY_AUTH_MODE=token RAY_AUTH_TOKEN=$(cat "
              << session << "/token)); docs/http.md";
  }
  std::cout << "\n  stop:    torus down" << std::endl;
  return 0;
}

}  // namespace

int RunLauncherCommand(const std::string& cmd, int argc, char** argv) {
  Flags f = ParseArgs(argc, argv, 2, kUpBoolFlags);
  if (cmd == "up") {
    RequireKnownFlags(cmd, f.flags, {"wait", "timeout", "port", "netns", "no-atomic-restart", "restart",
                                     "max-hosts", "kill-host", "signal", "session-dir", "help"});
  }
  if (cmd == "down") RequireKnownFlags(cmd, f.flags, {"session-dir", "help"});
  if ((cmd == "up" || cmd == "down") && f.Has("help")) {
    Usage();
    return 0;
  }
  if (cmd == "up") return RunUp(f);
  if (cmd == "down") return RunDown(f);
  if (cmd == "supervise") return RunSupervise(f);
  Usage();
  return 2;
}

}  // namespace torus
