// The `torus` command: CLI and daemons as subcommands.
//
//   torus start ... / torus stop          (cli/start.h)
//   torus status [--address A]
//   torus list nodes|actors|tasks|objects|workers [--format table|json] [--address A]
//   torus timeline ... / torus logs ...   (cli/timeline.h, cli/logs.h)
//   torus head ... / torus node ... / torus worker      (daemons; started by `start`)
//
// THREADS: main blocks SIGINT/SIGTERM before any thread starts for the daemons (cli/start.h).
#include <malloc.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cli/cluster_connect.h"
#include "cli/daemon_threads.h"
#include "cli/flags.h"
#include "cli/logs.h"
#include "cli/ray_compat.h"
#include "common/for_each_parallel.h"
#include "cli/resume.h"
#include "cli/start.h"
#include "cli/table.h"
#include "cli/timeline.h"
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
#include "core/timeline.h"
#include "core/worker_main.h"
#include "head/head.h"
#include "head/head_store.h"
#include "node/node.h"

namespace torus {
namespace {



// ------------------------------------------------------------------------------- status / list

nlohmann::ordered_json ResJson(const rpc::ResourceSet& r) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [k, v] : FromProto(r)) j[k] = v.ToDouble();
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
  for (const auto& [k, amount] : total) {
    double used = (amount - (avail.count(k) ? avail[k] : ResourceAmount())).ToDouble();
    double v = amount.ToDouble();
    bool bytes = k == "memory" || k == "object_store_memory";
    std::cout << "  " << std::setw(24) << std::left << k << " "
              << (bytes ? HumanBytes(used) + " / " + HumanBytes(v) : FormatAmount(used) + " / " + FormatAmount(v))
              << "\n";
  }
  // The object stores of the live nodes (each node asked once, 3 s at most; Ray's
  // object_store_memory line).
  std::vector<std::string> live;
  for (const auto& n : c.list.nodes()) {
    if (n.alive()) live.push_back(n.address());
  }
  struct Store {
    uint64_t used = 0, capacity = 0, spilled = 0, spilled_objects = 0;
  };
  auto stores = ForEachParallel<std::optional<Store>>(live, [&](const std::string& address) -> std::optional<Store> {
    rpc::NodeInfoReply info;
    auto ctx = NewContext(c.token, 3000);
    if (!rpc::Node::NewStub(GetOneOffChannel(address))->Info(ctx.get(), rpc::Empty(), &info).ok()) {
      return std::nullopt;
    }
    return Store{info.shm_bytes(), info.arena_capacity(), info.spilled_bytes(), info.spilled_objects()};
  });
  Store sum;
  size_t answered = 0;
  for (const auto& s : stores) {
    if (!s) continue;
    ++answered;
    sum.used += s->used;
    sum.capacity += s->capacity;
    sum.spilled += s->spilled;
    sum.spilled_objects += s->spilled_objects;
  }
  std::cout << "  " << std::setw(24) << std::left << "object store" << " " << HumanBytes(sum.used)
            << " / " << HumanBytes(sum.capacity) << ", " << HumanBytes(sum.spilled) << " spilled ("
            << sum.spilled_objects << " object(s))"
            << (answered < live.size() ? "  (" + std::to_string(live.size() - answered) + " node(s) did not answer)" : "")
            << "\n";
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
    j["pid"] = n.pid();
    j["is_head_node"] = n.is_head_node();
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

// The tasks of every submitter that answers: drivers and workers (core/timeline.h).
nlohmann::ordered_json ListTasks(const Cluster& c) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  {
    for (const auto& t : core::GatherTasks(c.list, c.token)) {
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
      j["node_id"] = t.node_id();
      j["start_us"] = t.start_us();
      j["end_us"] = t.end_us();
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
        j["spilled"] = o.spilled();
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
        j["job_id"] = w.job_id();
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
               "        [--labels k=v,...] [--bind HOST] [--listen-host HOST] [--block] [--new-session | --session-dir DIR]\n"
               "        (resumes the latest session when it has durable state; docs/fault_tolerance.md)\n"
               "        [--node-timeout-ms MS] [--max-heartbeats-per-s N] [--push-view-max-nodes N] [--view-records-per-s N]\n"
               "        [--keep-dead-nodes N (1000)] [--stray-bundle-grace-ms MS (10000)]\n"
               "        [--dashboard-host HOST] [--dashboard-port N (8265)] [--include-dashboard false]  (docs/http.md)\n"
               "        [--dashboard-agent-listen-port N (52365)] [--dashboard-agent-host HOST] [--object-store-memory BYTES]\n"
               "        [--object-spilling-directory DIR | --spill-dir DIR]   (docs/object_store.md)\n"
               "  start --address HOST:PORT [--num-cpus N] [--num-gpus N] [--memory BYTES] [--resources JSON]\n"
               "        [--labels k=v,...] [--bind HOST] [--heartbeat-ms MS] [--block] [--object-store-memory BYTES]\n"
               "        [--object-spilling-directory DIR | --spill-dir DIR]\n"
               "        [--dashboard-agent-listen-port N] [--dashboard-agent-host HOST]\n"
               "  up FILE.yaml [--wait] [--netns] [--no-atomic-restart]   (docs/launcher.md)\n"
               "  down\n"
               "  stop\n"
               "  status [--address A]\n"
               "  list nodes|actors|tasks|objects|workers|placement-groups|slices [--format table|json] [--address A]\n"
               "  job submit|status|logs|stop|list ...   (torus job --help; docs/jobs.md)\n"
               "  timeline [--output FILE]   recent tasks as Chrome trace JSON (docs/observability.md)\n"
               "  logs [NODE] [FILE] [--follow] [--tail N] [--worker ID | --actor ID [--err]]   node and worker logs\n"
               "  ray start|stop|status|health-check ...   Ray's CLI as KubeRay runs it (docs/kuberay.md)\n";
}

// The flags each user-facing command takes; anything else is refused (cli/flags.h).
const std::map<std::string, std::vector<std::string>>& KnownFlags() {
  static const std::map<std::string, std::vector<std::string>> k = [] {
    std::map<std::string, std::vector<std::string>> m = {
        {"start", StartFlags()},
        {"stop", {"force", "help"}},
        {"status", {"address", "help"}},
        {"list", {"address", "format", "help"}},
        {"timeline", {"address", "output", "help"}},
        {"logs", {"address", "follow", "tail", "actor", "worker", "err", "help"}},
    };
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
  // Ray's CLI for images (cli/ray_compat.h): `torus ray ARGS`, or this binary run as `ray`.
  if (std::string(argv[0]).substr(std::string(argv[0]).rfind('/') + 1) == "ray") {
    return RayCompatMain(std::vector<std::string>(argv + 1, argv + argc));
  }
  if (cmd == "ray") return RayCompatMain(std::vector<std::string>(argv + 2, argv + argc));
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
    if (cmd == "timeline") return Timeline(a);
    if (cmd == "logs") return Logs(a);
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
