// Head::CollectMetrics: the cluster's state as Prometheus gauges (docs/metrics.md), read when
// /metrics is scraped. The tables are copied under mu_ (no formatting under it); the families
// are built after.
#include <array>
#include <map>
#include <set>
#include <mutex>
#include <thread>

#include "common/metrics.h"
#include "common/rpc.h"
#include "common/wire_states.h"
#include "head/head.h"
#include "head/slices.h"

namespace torus {

namespace {

struct NodeSample {
  std::string id;
  bool alive = false;
  double heartbeat_age_s = 0;
};

// Counts by state name, every state present (0 when none) so that series do not vanish.
template <typename Enum, typename Descriptor>
std::map<std::string, int> ZeroCounts(const Descriptor* d) {
  std::map<std::string, int> out;
  for (int i = 0; i < d->value_count(); ++i) out[StateName(static_cast<Enum>(d->value(i)->number()))] = 0;
  return out;
}

void AddCounts(MetricFamilies& out, const std::string& name, const std::string& help,
               const std::map<std::string, int>& counts, const MetricLabels& extra = {}) {
  GaugeFamily f(name, help);
  for (const auto& [state, n] : counts) {
    MetricLabels l = extra;
    l.emplace_back("state", state);
    f.Add(n, l);
  }
  out.push_back(f.Take());
}

// Node membership, resources summed over alive nodes, and per node the heartbeat age (only the
// head knows it). Per-node resources come from each node's own /metrics: at 10,000 nodes they
// would make the head's answer ten times larger.
void AddNodeFamilies(MetricFamilies& out, const std::vector<NodeSample>& nodes, const ResourceMap& cluster_total,
                     const ResourceMap& cluster_avail) {
  GaugeFamily alive("torus_nodes", "Nodes the head knows, by state (alive, dead)");
  GaugeFamily age("torus_node_heartbeat_age_seconds", "Time since the head last heard from a node");
  int n_alive = 0;
  for (const auto& n : nodes) {
    if (!n.alive) continue;
    ++n_alive;
    age.Add(n.heartbeat_age_s, {{"node_id", n.id}});
  }
  alive.Add(n_alive, {{"state", "alive"}});
  alive.Add(static_cast<double>(nodes.size()) - n_alive, {{"state", "dead"}});
  out.push_back(alive.Take());
  out.push_back(age.Take());
  GaugeFamily ct("torus_cluster_resource_capacity", "The alive nodes' total of a resource");
  for (const auto& [r, v] : cluster_total) ct.Add(v.ToDouble(), {{"resource", r}});
  out.push_back(ct.Take());
  GaugeFamily ca("torus_cluster_resource_available", "What the alive nodes have free of a resource");
  for (const auto& [r, v] : cluster_avail) ca.Add(v.ToDouble(), {{"resource", r}});
  out.push_back(ca.Take());
}

// Tasks live with their owners (drivers): each is asked, 32 at a time, within one 2 s budget
// (500 ms each at most); one that does not answer is left out of the current counts (and
// counted), and its ended counts are taken as last seen.
void AddTaskCounts(MetricFamilies& out, const std::vector<std::pair<std::string, std::string>>& drivers,
                   const std::string& token,
                   EndedTaskCounts& ended) {
  std::map<std::string, int64_t> current = {{"PENDING_ARGS", 0}, {"PENDING", 0}, {"RUNNING", 0}};
  int unanswered = 0;
  std::mutex mu;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  std::map<std::string, std::array<int64_t, 2>> seen;
  for (size_t begin = 0; begin < drivers.size(); begin += 32) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      unanswered += static_cast<int>(drivers.size() - begin);
      break;
    }
    std::vector<std::thread> ts;
    for (size_t i = begin; i < std::min(drivers.size(), begin + 32); ++i) {
      ts.emplace_back([&, i] {
        rpc::TaskCountsReply r;
        auto ctx = NewContext(token, std::min<int64_t>(500, left.count()));
        auto st = rpc::CoreWorker::NewStub(GetChannel(drivers[i].second))->TaskCounts(ctx.get(), rpc::Empty(), &r);
        std::lock_guard<std::mutex> lock(mu);
        if (!st.ok()) {
          ++unanswered;
          return;
        }
        for (const auto& [k, v] : r.current()) current[k] += v;
        auto get = [&](const char* k) { return r.ended().count(k) ? r.ended().at(k) : int64_t{0}; };
        seen[drivers[i].first] = {get("FINISHED"), get("FAILED")};
      });
    }
    for (auto& t : ts) t.join();
  }
  // Drivers gone since the last scrape keep their counts in `gone`; the others' are updated
  // (not those that finished meanwhile: their final counts are in `gone` already).
  std::set<std::string> live;
  for (const auto& d : drivers) live.insert(d.first);
  for (auto it = ended.finished.begin(); it != ended.finished.end();) {
    seen.erase(*it);
    it = live.count(*it) ? std::next(it) : ended.finished.erase(it);
  }
  for (auto it = ended.last.begin(); it != ended.last.end();) {
    if (live.count(it->first)) {
      ++it;
      continue;
    }
    ended.gone[0] += it->second[0];
    ended.gone[1] += it->second[1];
    it = ended.last.erase(it);
  }
  for (const auto& [d, c] : seen) {
    auto& last = ended.last[d];
    last = {std::max(last[0], c[0]), std::max(last[1], c[1])};
  }
  std::array<int64_t, 2> sum = ended.gone;
  for (const auto& [d, c] : ended.last) {
    sum[0] += c[0];
    sum[1] += c[1];
  }
  GaugeFamily now("torus_tasks", "Tasks of the live drivers by state (PENDING_ARGS, PENDING, RUNNING)");
  for (const auto& [k, v] : current) now.Add(static_cast<double>(v), {{"state", k}});
  out.push_back(now.Take());
  prometheus::MetricFamily total;
  total.name = "torus_tasks_ended_total";
  total.help = "Tasks ended (FINISHED, FAILED) by drivers since the head started";
  total.type = prometheus::MetricType::Counter;
  for (int k = 0; k < 2; ++k) {
    prometheus::ClientMetric m;
    m.label = {{"state", k == 0 ? "FINISHED" : "FAILED"}};
    m.counter.value = static_cast<double>(sum[k]);
    total.metric.push_back(std::move(m));
  }
  out.push_back(std::move(total));
  GaugeFamily miss("torus_task_count_unanswered_drivers", "Drivers that did not give their task counts to the last scrape");
  miss.Add(unanswered);
  out.push_back(miss.Take());
}

}  // namespace

void Head::NoteDriverEndedTasks(const std::string& job_id, int64_t finished, int64_t failed) {
  MutexLock lock(metrics_mu_);
  auto it = ended_tasks_.last.find(job_id);
  if (it != ended_tasks_.last.end()) {
    finished = std::max(finished, it->second[0]);
    failed = std::max(failed, it->second[1]);
    ended_tasks_.last.erase(it);
  }
  ended_tasks_.gone[0] += finished;
  ended_tasks_.gone[1] += failed;
  ended_tasks_.finished.insert(job_id);
}

MetricFamilies Head::CollectMetrics() {
  std::vector<NodeSample> nodes;
  std::map<uint32_t, ResourceAmount> total_by_id, avail_by_id;
  ResourceMap cluster_total, cluster_avail;
  std::vector<std::pair<std::string, std::string>> drivers;  // (job id, driver address)
  rpc::ListReply tables;
  std::map<std::string, int> slices = {{"free", 0}, {"reserved", 0}, {"broken", 0}};
  {
    MutexLock lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    nodes.reserve(nodes_.size());
    for (const auto& [id, n] : nodes_) {
      NodeSample s;
      s.id = id;
      s.alive = n.alive;
      if (n.alive) {
        for (const auto& [name, v] : *n.total) total_by_id[name] += v;
        for (const auto& [name, v] : n.Available()) avail_by_id[name] += v;
        s.heartbeat_age_s = std::chrono::duration<double>(now - n.last_heartbeat).count();
      }
      nodes.push_back(std::move(s));
    }
    CompactResources t(total_by_id.begin(), total_by_id.end()), a(avail_by_id.begin(), avail_by_id.end());
    cluster_total = ToResourceMap(names_, t);
    cluster_avail = ToResourceMap(names_, a);
    for (const auto& [id, j] : jobs_) {
      if (!j.driver_address().empty()) drivers.emplace_back(id, j.driver_address());
    }
    actors_.AssertHeld();  // it shares mu_
    actors_.AppendTo(&tables);
    pg_manager_.AssertHeld();  // it shares mu_
    pg_manager_.AppendTo(&tables);
    std::map<std::string, int> index_of;
    for (const auto& s : AllSlices(ViewOfNodes(&index_of, /*with_labels=*/true))) {
      ++slices[!s.intact ? "broken" : !pg_manager_.HolderOf(s.name).empty() ? "reserved" : "free"];
    }
  }
  MetricFamilies out;
  AddNodeFamilies(out, nodes, cluster_total, cluster_avail);

  auto actor_states = ZeroCounts<rpc::ActorRecord::State>(rpc::ActorRecord::State_descriptor());
  for (const auto& a : tables.actors()) ++actor_states[StateName(a.state())];
  AddCounts(out, "torus_actors", "Actors by state", actor_states);
  auto pg_states = ZeroCounts<rpc::PlacementGroupRecord::State>(rpc::PlacementGroupRecord::State_descriptor());
  auto slice_pg_states = pg_states;
  for (const auto& g : tables.placement_groups()) {
    ++(g.has_slice() ? slice_pg_states : pg_states)[StateName(g.state())];
  }
  AddCounts(out, "torus_placement_groups", "Placement groups by state and kind (group, slice reservation)",
            pg_states, {{"kind", "group"}});
  out.back().metric.reserve(out.back().metric.size() + slice_pg_states.size());
  for (const auto& [state, n] : slice_pg_states) {
    prometheus::ClientMetric m;
    m.label = {{"kind", "slice"}, {"state", state}};
    m.gauge.value = n;
    out.back().metric.push_back(std::move(m));
  }
  AddCounts(out, "torus_slices", "TPU slices by state (free, reserved, broken: a host is missing)", slices);

  {
    MutexLock lock(metrics_mu_);
    AddTaskCounts(out, drivers, cfg_.token, ended_tasks_);
  }

  auto job_states = ZeroCounts<rpc::JobRecord::State>(rpc::JobRecord::State_descriptor());
  if (job_manager_) {
    for (const auto& j : job_manager_->List()) ++job_states[StateName(j.state())];
  }
  AddCounts(out, "torus_jobs", "Submitted jobs by state", job_states);
  return out;
}

}  // namespace torus
