// Placement decisions over the head's placement index (common/placement_index.h) at 1,000 to
// 50,000 simulated TPU hosts, in one process (no RPC, no lock): the same node entries, labels
// and resources as bench/head_scale.cc's hosts (v6e 4x4 slice members: CPU 8, memory, TPU 4, the
// slice head unit on worker 0), the same PlaceBundles and actor choice the head runs. Between
// decisions a few hosts take or give back CPU, as leases do, so the index is never pristine.
// Prints one CSV row per size: decision p50/p99 in microseconds for each strategy (4 bundles of
// CPU 1), a label-selected and a custom-resource SPREAD group, STRICT_SPREAD over 64 hosts, an
// actor; and the index's own memory per host (mallinfo2, index built after the entries).
// Usage: placement_bench [--sizes 1000,10000,50000] [--decisions 2000]
#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "common/node_table.h"
#include "common/placement_index.h"
#include "common/tpu_labels.h"
#include "head/placement.h"
#include "tpu/node_identity.h"

namespace {

using Clock = std::chrono::steady_clock;
using namespace torus;

size_t HeapInUse() { return mallinfo2().uordblks; }

double Pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

rpc::NodeRecord SimHost(int i) {
  int slice = i / 4, worker = i % 4;
  char slice_name[32];
  snprintf(slice_name, sizeof slice_name, "sim-v6e16-%05d", slice);
  std::string hosts;
  for (int w = 0; w < 4; ++w) hosts += (w ? "," : "") + std::string(slice_name) + "-w" + std::to_string(w);
  tpu::NodeTpuInput in;
  in.env = {{"TPU_NAME", slice_name},       {"TPU_WORKER_ID", std::to_string(worker)},
            {"TPU_ACCELERATOR_TYPE", "v6e-16"}, {"TPU_TOPOLOGY", "4x4"},
            {"TPU_WORKER_HOSTNAMES", hosts}, {"TORUS_TPU_CHIPS", "4"}};
  auto id = tpu::ComputeNodeTpuIdentity(in);
  if (!id.ok()) {
    std::cerr << id.status().ToString() << std::endl;
    std::exit(1);
  }
  rpc::NodeRecord rec;
  char node_id[32];
  snprintf(node_id, sizeof node_id, "%028x", i * 2654435761u);
  rec.set_node_id(node_id);
  rec.set_address("10.0." + std::to_string(i / 256) + "." + std::to_string(i % 256) + ":7000");
  rec.set_hostname(std::string(slice_name) + "-w" + std::to_string(worker));
  auto labels = id->labels;
  labels[std::string(kLabelNodeId)] = rec.node_id();
  labels["torus.io/hostname"] = rec.hostname();
  for (const auto& [k, v] : labels) (*rec.mutable_labels())[k] = v;
  ResourceMap total = {{"CPU", 8}, {"memory", 64.0 * (1ull << 30)}};
  for (const auto& [k, v] : id->resources) total[k] = v;
  ToProto(total, rec.mutable_total());
  ToProto(total, rec.mutable_available());
  return rec;
}

struct Variant {
  std::string name;
  PgStrategy strategy;
  int bundles = 4;
  std::string resource = "CPU";
  bool by_label = false;
  bool actor = false;
};

void RunSize(int n, int decisions, bool header) {
  NamePool pool;
  std::map<std::string, NodeEntry> nodes;
  for (int i = 0; i < n; ++i) {
    rpc::NodeRecord rec = SimHost(i);
    auto& e = nodes[rec.node_id()];
    SetFromRecord(pool, rec, &e);
    e.alive = true;
  }
  malloc_trim(0);
  size_t before = HeapInUse();
  PlacementIndex index(pool, [&](std::string_view id) -> const NodeEntry* {
    auto it = nodes.find(std::string(id));
    return it == nodes.end() ? nullptr : &it->second;
  });
  for (auto& [id, e] : nodes) index.Upsert(id, e);
  double index_bytes_per_host = (static_cast<double>(HeapInUse()) - static_cast<double>(before)) / n;

  std::vector<std::map<std::string, NodeEntry>::iterator> by_i;
  for (auto it = nodes.begin(); it != nodes.end(); ++it) by_i.push_back(it);
  std::mt19937 rng(1);
  // Leases come and go: a few hosts change their free CPU between decisions.
  auto churn = [&] {
    for (int k = 0; k < 4; ++k) {
      auto it = by_i[rng() % by_i.size()];
      ResourceMap avail = ToResourceMap(pool, *it->second.total);
      avail["CPU"] = static_cast<double>(rng() % 9);
      SetAvailable(pool, avail, &it->second);
      index.Upsert(it->first, it->second);
    }
  };
  const std::vector<Variant> variants = {
      {"pack4", PgStrategy::kPack},
      {"spread4", PgStrategy::kSpread},
      {"strict_pack4", PgStrategy::kStrictPack},
      {"strict_spread4", PgStrategy::kStrictSpread},
      {"spread4_label", PgStrategy::kSpread, 4, "CPU", true},
      {"spread4_custom", PgStrategy::kSpread, 4, "TPU-v6e-16-head"},
      {"strict_spread64", PgStrategy::kStrictSpread, 64},
      {"actor", PgStrategy::kPack, 1, "CPU", false, true}};
  std::ostringstream row, head;
  row << n << "," << index_bytes_per_host;
  head << "hosts,index_bytes_per_host";
  for (const auto& v : variants) {
    std::vector<double> us;
    int placed = 0;
    for (int d = 0; d < decisions; ++d) {
      churn();
      std::vector<BundleDemand> bundles(v.bundles);
      char wanted[32];
      snprintf(wanted, sizeof wanted, "sim-v6e16-%05d", static_cast<int>(rng() % std::max(1, n / 4)));
      for (auto& b : bundles) {
        b.resources = {{v.resource, 1}};
        if (v.by_label) b.selector = {{std::string(tpu::kLabelSliceName), LabelCondition::Op::kEq, {wanted}}};
      }
      auto t0 = Clock::now();
      bool ok;
      if (v.actor) {
        // The head's actor choice: the first candidate (ActorDirectory::PlaceOnNodeLocked).
        auto demand = index.Compile(bundles[0].resources, bundles[0].selector);
        ok = false;
        index.ForEach(demand, false, [&](uint32_t) {
          ok = true;
          return false;
        });
      } else {
        ok = PlaceBundles(bundles, index, v.strategy).has_value();
      }
      us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
      placed += ok;
    }
    if (placed == 0) std::cerr << "placement_bench: " << v.name << " never placed at " << n << std::endl;
    row << "," << Pct(us, 0.5) << "," << Pct(us, 0.99);
    head << "," << v.name << "_us_p50," << v.name << "_us_p99";
  }
  if (header) std::cout << head.str() << "\n";
  std::cout << row.str() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {1000, 2000, 5000, 10000, 20000, 50000};
  int decisions = 2000;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--sizes") {
      sizes.clear();
      std::stringstream ss(argv[i + 1]);
      std::string item;
      while (std::getline(ss, item, ',')) sizes.push_back(std::stoi(item));
    } else if (flag == "--decisions") {
      decisions = std::stoi(argv[i + 1]);
    } else {
      std::cerr << "usage: placement_bench [--sizes 1000,10000,50000] [--decisions 2000]" << std::endl;
      return 2;
    }
  }
  for (size_t k = 0; k < sizes.size(); ++k) RunSize(sizes[k], decisions, k == 0);
  return 0;
}
