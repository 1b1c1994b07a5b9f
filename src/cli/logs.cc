#include "cli/logs.h"

#include <fnmatch.h>

#include <algorithm>
#include <chrono>
#include <iomanip>
#include <iostream>
#include <thread>
#include <vector>

#include "cli/cluster_connect.h"
#include "common/for_each_parallel.h"
#include "common/rpc.h"
#include "proto/torus.grpc.pb.h"

namespace torus {
namespace {

struct NodeLogs {
  const rpc::NodeRecord* node = nullptr;
  rpc::LogFileList files;
  std::string error;  // the node did not answer
};

// Every live node's files, asked in parallel.
std::vector<NodeLogs> ListAll(const Cluster& c) {
  std::vector<const rpc::NodeRecord*> alive;
  for (const auto& n : c.list.nodes()) {
    if (n.alive()) alive.push_back(&n);
  }
  return ForEachParallel<NodeLogs>(alive, [&c](const rpc::NodeRecord* n) {
    NodeLogs out;
    out.node = n;
    auto ctx = NewContext(c.token, 5000);
    auto st = rpc::Node::NewStub(GetOneOffChannel(n->address()))->ListLogs(ctx.get(), rpc::Empty(), &out.files);
    if (!st.ok()) out.error = st.error_message();
    return out;
  });
}

// " (not asked: nodes A, B did not answer)" for the nodes whose listing failed, or "".
std::string Unanswered(const std::vector<NodeLogs>& all) {
  std::string ids;
  for (const auto& l : all) {
    if (!l.error.empty()) ids += (ids.empty() ? "" : ", ") + l.node->node_id().substr(0, 12);
  }
  return ids.empty() ? "" : " (nodes " + ids + " did not answer)";
}

// True when `who` names node `l`: an id prefix (4+ characters), its address or host, its host
// name, or its launcher name (the stem of its own log file, with or without "node-").
bool Names(const NodeLogs& l, const std::string& who) {
  const rpc::NodeRecord& n = *l.node;
  if (who.size() >= 4 && n.node_id().rfind(who, 0) == 0) return true;
  if (who == n.address() || who == HostOf(n.address()) || who == n.hostname()) return true;
  for (const auto& f : l.files.files()) {
    if (f.kind() != "node") continue;
    const std::string stem = f.name().substr(0, f.name().rfind('.'));
    if (stem == who || stem == "node-" + who) return true;
  }
  return false;
}

std::string Describe(const rpc::NodeRecord& n) {
  return n.node_id().substr(0, 12) + " " + n.address() + (n.hostname().empty() ? "" : " (" + n.hostname() + ")");
}

void PrintListing(const std::vector<const NodeLogs*>& nodes) {
  for (const NodeLogs* l : nodes) {
    std::cout << "Node " << Describe(*l->node) << "\n";
    if (!l->error.empty()) {
      std::cout << "  (did not answer: " << l->error << ")\n";
      continue;
    }
    size_t width = 4;
    for (const auto& f : l->files.files()) width = std::max(width, f.name().size());
    for (const auto& f : l->files.files()) {
      std::cout << "  " << f.name() << std::string(width - f.name().size() + 2, ' ') << std::setw(10)
                << HumanBytes(static_cast<double>(f.size())) << "  " << f.kind();
      if (!f.worker_id().empty()) std::cout << " " << f.worker_id().substr(0, 12);
      if (!f.job_id().empty()) std::cout << " job " << f.job_id();
      std::cout << "\n";
    }
  }
  std::cout << std::flush;
}

int TailFlag(const Args& a) {
  const std::string v = a.Get("tail", "1000");
  try {
    size_t used = 0;
    int n = std::stoi(v, &used);
    if (used == v.size() && n >= -1) return n;
  } catch (...) {
  }
  Die("--tail must be a number of lines (-1 = the whole file), got '" + v + "'");
}

// Prints `file` of `node` from its last `tail` lines (-1: all), then, with `follow`, what is
// appended until the process is interrupted. Following rides out a node that does not answer for
// up to 30 s (a busy or restarting node); a plain read fails at once.
int Print(const Cluster& c, const rpc::NodeRecord& node, const std::string& file, int tail, bool follow) {
  auto stub = rpc::Node::NewStub(GetOneOffChannel(node.address()));
  rpc::ReadLogRequest req;
  req.set_name(file);
  req.set_offset(tail < 0 ? 0 : -1);
  req.set_tail_lines(std::max(tail, 0));
  req.set_max_bytes(1 << 20);
  int64_t offset = -1;
  auto failing_since = std::chrono::steady_clock::time_point{};
  for (;;) {
    rpc::ReadLogReply r;
    auto ctx = NewContext(c.token, 10000);
    auto st = stub->ReadLog(ctx.get(), req, &r);
    if (!st.ok()) {
      const auto now = std::chrono::steady_clock::now();
      if (failing_since == std::chrono::steady_clock::time_point{}) failing_since = now;
      const bool transient = st.error_code() == grpc::StatusCode::UNAVAILABLE ||
                             st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED;
      if (!follow || !transient || now - failing_since > std::chrono::seconds(30)) {
        Die("reading " + file + " on node " + Describe(node) + ": " + st.error_message());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      continue;
    }
    failing_since = {};
    if (offset >= 0 && r.size() < offset) {
      std::cerr << "torus: " << file << " shrank (truncated or replaced); reading it from its start" << std::endl;
      req.set_offset(0);
      offset = 0;
      continue;
    }
    std::cout.write(r.data().data(), static_cast<std::streamsize>(r.data().size()));
    offset = r.offset() + static_cast<int64_t>(r.data().size());
    req.set_offset(offset);
    if (!r.data().empty() && offset < r.size()) continue;  // more already there
    std::cout.flush();
    if (!follow) return 0;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

// The file of a worker (by id prefix) on whichever node has it.
int PrintWorker(const Cluster& c, const std::vector<NodeLogs>& all, const std::string& worker, bool err,
                int tail, bool follow) {
  const std::string suffix = err ? ".err" : ".out";
  std::vector<std::pair<const NodeLogs*, std::string>> hits;
  for (const auto& l : all) {
    for (const auto& f : l.files.files()) {
      if (f.kind() == "worker" && f.worker_id().rfind(worker, 0) == 0 && f.name().size() > suffix.size() &&
          f.name().compare(f.name().size() - suffix.size(), suffix.size(), suffix) == 0) {
        hits.emplace_back(&l, f.name());
      }
    }
  }
  if (hits.empty()) {
    Die("no live node has the log of worker " + worker + " (torus list workers shows workers)" + Unanswered(all));
  }
  if (hits.size() > 1) Die("worker id " + worker + " is ambiguous: give more of it");
  return Print(c, *hits[0].first->node, hits[0].second, tail, follow);
}

}  // namespace

int Logs(const Args& a) {
  const int tail = TailFlag(a);
  const bool follow = a.Has("follow");
  if (a.positional.size() > 2) Die("usage: torus logs [NODE] [FILE] [--follow] [--tail N] (torus --help)");
  Cluster c = Connect(a);
  const std::vector<NodeLogs> all = ListAll(c);
  if (a.Has("actor") || a.Has("worker")) {
    if (!a.positional.empty()) Die("--actor and --worker take no NODE or FILE");
    std::string worker = a.Get("worker");
    if (a.Has("actor")) {
      const std::string id = a.Get("actor");
      int matches = 0;
      for (const auto& act : c.list.actors()) {
        if (!id.empty() && act.actor_id().rfind(id, 0) == 0) {
          worker = act.worker_id();
          ++matches;
        }
      }
      if (matches > 1) Die("actor id " + id + " is ambiguous: give more of it");
      if (worker.empty()) Die("no actor " + id + " with a worker (torus list actors shows actors)");
    }
    return PrintWorker(c, all, worker, a.Has("err"), tail, follow);
  }
  if (a.Has("err")) Die("--err goes with --worker or --actor (a FILE names .out or .err itself)");
  std::vector<const NodeLogs*> chosen;
  std::string pattern;
  if (!a.positional.empty()) {
    for (const auto& l : all) {
      if (Names(l, a.positional[0])) chosen.push_back(&l);
    }
    if (a.positional.size() == 2) {
      if (chosen.empty()) Die("no live node is named '" + a.positional[0] + "' (torus logs lists them)");
      if (chosen.size() > 1) Die("'" + a.positional[0] + "' names " + std::to_string(chosen.size()) + " nodes: give an id prefix or address");
      pattern = a.positional[1];
    } else if (chosen.empty()) {
      pattern = a.positional[0];  // a file on whichever node has it
    }
  }
  if (pattern.empty()) {
    if (follow || a.Has("tail")) Die("--follow and --tail need a FILE, --worker or --actor");
    if (chosen.empty()) {
      for (const auto& l : all) chosen.push_back(&l);
    }
    if (chosen.empty()) Die("the cluster has no live node");
    PrintListing(chosen);
    return 0;
  }
  if (chosen.empty()) {
    for (const auto& l : all) chosen.push_back(&l);
  }
  std::vector<std::pair<const NodeLogs*, std::string>> hits;
  for (const NodeLogs* l : chosen) {
    for (const auto& f : l->files.files()) {
      if (fnmatch(pattern.c_str(), f.name().c_str(), 0) == 0) hits.emplace_back(l, f.name());
    }
  }
  if (hits.empty()) {
    Die((a.positional.size() == 1 ? "no live node or log file is named '" : "no log file matches '") + pattern +
        "' (torus logs lists them)" + Unanswered(all));
  }
  if (hits.size() > 1) {
    std::cerr << "torus: '" << pattern << "' matches " << hits.size() << " files; name one (and its node):\n";
    for (const auto& [l, name] : hits) std::cerr << "  torus logs " << l->node->node_id().substr(0, 12) << " " << name << "\n";
    return 1;
  }
  return Print(c, *hits[0].first->node, hits[0].second, tail, follow);
}

}  // namespace torus
