#include "core/timeline.h"

#include <algorithm>
#include <map>
#include <set>
#include <unordered_set>

#include "common/for_each_parallel.h"
#include "common/rpc.h"
#include "common/wire_states.h"
#include "proto/torus.grpc.pb.h"

namespace torus::core {


std::vector<rpc::TaskInfo> GatherTasks(const rpc::ListReply& cluster, const std::string& token,
                                       int deadline_ms) {
  // The workers of every live node (their addresses), then every submitter.
  std::vector<std::string> nodes;
  for (const auto& n : cluster.nodes()) {
    if (n.alive()) nodes.push_back(n.address());
  }
  auto infos = ForEachParallel<rpc::NodeInfoReply>(nodes, [&](const std::string& addr) {
    rpc::NodeInfoReply info;
    auto ctx = NewContext(token, deadline_ms);
    (void)rpc::Node::NewStub(GetOneOffChannel(addr))->Info(ctx.get(), rpc::Empty(), &info);
    return info;
  });
  std::set<std::string> submitters;
  for (const auto& j : cluster.jobs()) {
    if (!j.driver_address().empty()) submitters.insert(j.driver_address());
  }
  for (const auto& info : infos) {
    for (const auto& w : info.workers()) {
      if (!w.address().empty() && w.state() != rpc::WorkerInfo::STARTING) submitters.insert(w.address());
    }
  }
  std::vector<std::string> addrs(submitters.begin(), submitters.end());
  auto lists = ForEachParallel<rpc::TaskList>(addrs, [&](const std::string& addr) {
    rpc::TaskList list;
    auto ctx = NewContext(token, deadline_ms);
    (void)rpc::CoreWorker::NewStub(GetOneOffChannel(addr))->ListTasks(ctx.get(), rpc::Empty(), &list);
    return list;
  });
  std::vector<rpc::TaskInfo> out;
  std::unordered_set<std::string> seen;
  for (auto& list : lists) {
    for (auto& t : *list.mutable_tasks()) {
      if (seen.insert(t.task_id()).second) out.push_back(std::move(t));
    }
  }
  return out;
}

nlohmann::json TimelineEvents(const std::vector<rpc::TaskInfo>& tasks, const rpc::ListReply& cluster,
                              int64_t now_us) {
  std::map<std::string, std::string> hostnames;
  for (const auto& n : cluster.nodes()) hostnames[n.node_id()] = n.hostname();
  // Small integer ids for rows: the trace format's pid and tid are numbers.
  std::map<std::string, int> pids;
  std::map<std::pair<int, std::string>, int> tids;
  nlohmann::json events = nlohmann::json::array();
  auto pid_of = [&](const std::string& node) {
    auto [it, fresh] = pids.try_emplace(node, static_cast<int>(pids.size()) + 1);
    if (fresh) {
      std::string name = node.empty() ? "Node (unknown)" : "Node " + node.substr(0, 12);
      if (auto h = hostnames.find(node); h != hostnames.end() && !h->second.empty()) {
        name += " (" + h->second + ")";
      }
      events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", it->second}, {"args", {{"name", name}}}});
    }
    return it->second;
  };
  auto tid_of = [&](int pid, const std::string& worker) {
    auto [it, fresh] = tids.try_emplace({pid, worker}, static_cast<int>(tids.size()) + 1);
    if (fresh) {
      events.push_back({{"ph", "M"},
                        {"name", "thread_name"},
                        {"pid", pid},
                        {"tid", it->second},
                        {"args", {{"name", "Worker " + worker.substr(0, 12)}}}});
    }
    return it->second;
  };
  std::vector<const rpc::TaskInfo*> ran;
  for (const auto& t : tasks) {
    if (t.start_us() > 0) ran.push_back(&t);
  }
  std::sort(ran.begin(), ran.end(), [](const rpc::TaskInfo* a, const rpc::TaskInfo* b) {
    return a->start_us() != b->start_us() ? a->start_us() < b->start_us() : a->task_id() < b->task_id();
  });
  for (const rpc::TaskInfo* t : ran) {
    const int pid = pid_of(t->node_id());
    const int tid = tid_of(pid, t->worker_id());
    const bool running = t->end_us() <= 0;
    const int64_t end = running ? std::max(now_us, t->start_us()) : t->end_us();
    const bool failed = t->state() == rpc::TaskInfo::FAILED;
    nlohmann::json args = {{"task_id", t->task_id()},   {"job_id", t->job_id()},
                           {"state", StateName(t->state())}, {"attempt", t->attempt()},
                           {"node_id", t->node_id()},   {"worker_id", t->worker_id()}};
    if (!t->actor_id().empty()) args["actor_id"] = t->actor_id();
    if (!t->error().empty()) args["error"] = t->error();
    events.push_back({{"ph", "X"},
                      {"cat", t->actor_id().empty() ? "task" : "actor_task"},
                      {"name", t->name()},
                      {"pid", pid},
                      {"tid", tid},
                      {"ts", t->start_us()},
                      {"dur", end - t->start_us()},
                      {"cname", failed ? "terrible" : running ? "yellow" : "generic_work"},
                      {"args", std::move(args)}});
  }
  return events;
}

}  // namespace torus::core
