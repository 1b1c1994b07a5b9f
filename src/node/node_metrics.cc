// Node::CollectMetrics: this node's state as Prometheus gauges (docs/metrics.md), read when its
// /metrics is scraped.
#include <map>

#include "common/metrics.h"
#include "common/wire_states.h"
#include "node/node.h"

namespace torus {

MetricFamilies Node::CollectMetrics() {
  auto store = objects_.GetStats();
  const MetricLabels node = {{"node_id", cfg_.node_id}};
  ResourceMap total, available;
  std::map<std::string, int> workers;
  for (int i = 0; i < rpc::WorkerInfo::State_descriptor()->value_count(); ++i) {
    auto st = static_cast<rpc::WorkerInfo::State>(rpc::WorkerInfo::State_descriptor()->value(i)->number());
    if (st != rpc::WorkerInfo::DRIVER) workers[StateName(st)] = 0;
  }
  {
    MutexLock lock(st_.mu);
    total = st_.ledger.total();
    available = st_.ledger.available();
    for (const auto& [id, w] : st_.pool.workers()) {
      if (w->state == WorkerState::kDriver) continue;
      ++workers[StateName(w->hold.blocked ? rpc::WorkerInfo::BLOCKED : WireState(w->state))];
    }
  }
  MetricFamilies out;
  GaugeFamily used("torus_object_store_used_bytes", "Bytes of objects in the node's object store");
  used.Add(static_cast<double>(store.bytes), node);
  out.push_back(used.Take());
  GaugeFamily cap("torus_object_store_capacity_bytes", "The node's object store size");
  cap.Add(static_cast<double>(store.capacity), node);
  out.push_back(cap.Take());
  GaugeFamily objects("torus_object_store_objects", "Objects in the node's object store");
  objects.Add(static_cast<double>(store.objects), node);
  out.push_back(objects.Take());
  GaugeFamily spilled("torus_object_store_spilled_bytes", "Bytes of objects spilled to the node's disk");
  spilled.Add(static_cast<double>(store.spilled_bytes), node);
  out.push_back(spilled.Take());
  GaugeFamily t("torus_node_resource_capacity", "A node's total of a resource (CPU, TPU, memory in bytes, custom)");
  for (const auto& [r, v] : total) t.Add(v.ToDouble(), {{"node_id", cfg_.node_id}, {"resource", r}});
  out.push_back(t.Take());
  GaugeFamily a("torus_node_resource_available", "What a node has free of a resource");
  for (const auto& [r, v] : available) a.Add(v.ToDouble(), {{"node_id", cfg_.node_id}, {"resource", r}});
  out.push_back(a.Take());
  GaugeFamily w("torus_workers", "The node's worker processes by state");
  for (const auto& [state, n] : workers) w.Add(n, {{"node_id", cfg_.node_id}, {"state", state}});
  out.push_back(w.Take());
  return out;
}

}  // namespace torus
