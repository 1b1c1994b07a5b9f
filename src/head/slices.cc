#include "head/slices.h"

#include <algorithm>

namespace torus {

namespace {
const std::string kSlice(tpu::kLabelSliceName);
const std::string kWorker(tpu::kLabelWorkerId);
const std::string kPod(tpu::kLabelPodType);
const std::string kTopo(tpu::kLabelTopology);

ResourceAmount Get(const ResourceMap& m, const std::string& k) {
  auto it = m.find(k);
  return it == m.end() ? ResourceAmount() : it->second;
}
std::string Label(const NodeView& n, const std::string& k) {
  auto it = n.labels.find(k);
  return it == n.labels.end() ? "" : it->second;
}

void Evaluate(SliceView& s, const std::vector<NodeView>& nodes, int chips_total,
              std::optional<int> chips_per_vm) {
  s.intact = static_cast<int>(s.hosts.size()) == s.hosts_expected && s.hosts_expected > 0;
  ResourceAmount tpu;
  for (int idx : s.hosts) {
    if (idx < 0) {
      s.intact = false;
      continue;
    }
    tpu += Get(nodes[idx].total, "TPU");
    if (chips_per_vm && Get(nodes[idx].total, "TPU") != ResourceAmount(*chips_per_vm)) s.intact = false;
  }
  if (chips_total > 0 && tpu != ResourceAmount(chips_total)) s.intact = false;
  if (!s.intact) {
    s.idle = false;
    return;
  }
  int busy = 0;
  for (size_t w = 0; w < s.hosts.size(); ++w) {
    busy += SliceIdleRule::HostBusy(static_cast<int>(w), SliceHostUseOf(nodes[s.hosts[w]], s.pod_type));
  }
  s.idle = SliceIdleRule::SliceIdle(s.intact, busy);
}
}  // namespace

SliceHostUse SliceHostUseOf(const NodeView& n, const std::string& pod_type) {
  std::string head = SliceIdleRule::HeadUnit(pod_type);
  return {Get(n.total, "TPU"), Get(n.available, "TPU"), Get(n.total, head), Get(n.available, head)};
}

std::vector<SliceView> FindSlices(const std::vector<NodeView>& nodes, const tpu::SliceShape& shape,
                                  std::optional<int> chips_per_vm) {
  std::map<std::string, SliceView> by_name;
  std::vector<SliceView> out;
  for (size_t i = 0; i < nodes.size(); ++i) {
    const NodeView& n = nodes[i];
    if (Label(n, kPod) != shape.pod_type) continue;
    std::string name = Label(n, kSlice);
    if (name.empty()) {
      // Anonymous single-host slice: the node itself, if it holds the whole slice.
      if (shape.single_host && Get(n.total, "TPU") >= shape.chips) {
        SliceView s;
        s.name = n.id;
        s.pod_type = shape.pod_type;
        s.topology = Label(n, kTopo);
        s.hosts_expected = 1;
        s.hosts = {static_cast<int>(i)};
        Evaluate(s, nodes, 0, chips_per_vm);
        out.push_back(s);
      }
      continue;
    }
    SliceView& s = by_name[name];
    s.name = name;
    s.pod_type = shape.pod_type;
    s.topology = Label(n, kTopo);
    s.hosts_expected = shape.hosts;
    if (s.hosts.empty()) s.hosts.assign(shape.hosts, -1);
    int w = -1;
    try {
      w = std::stoi(Label(n, kWorker));
    } catch (...) {
    }
    if (w < 0 || w >= shape.hosts || s.hosts[w] >= 0) {
      s.hosts_expected = -1;  // a worker id out of range or given twice: not intact
      continue;
    }
    s.hosts[w] = static_cast<int>(i);
  }
  for (auto& [name, s] : by_name) {
    if (s.hosts_expected < 0) {
      s.intact = s.idle = false;
      s.hosts_expected = shape.hosts;
    } else {
      Evaluate(s, nodes, shape.chips, chips_per_vm);
    }
    out.push_back(s);
  }
  std::sort(out.begin(), out.end(), [](const SliceView& a, const SliceView& b) { return a.name < b.name; });
  return out;
}

std::vector<SliceView> AllSlices(const std::vector<NodeView>& nodes) {
  std::map<std::string, std::vector<NodeView>> pods;
  std::set<std::string> pod_types;
  for (const auto& n : nodes) {
    std::string p = Label(n, kPod);
    if (!p.empty() && Get(n.total, "TPU") > 0) pod_types.insert(p);
  }
  std::vector<SliceView> out;
  for (const auto& p : pod_types) {
    auto pt = tpu::ParsePodType(p);
    if (!pt.ok()) continue;
    // Hosts per slice from a live node (section 3.6): uniform chips per host assumed.
    int node_chips = 0;
    std::string topo;
    for (const auto& n : nodes) {
      if (Label(n, kPod) == p) {
        node_chips = static_cast<int>(Get(n.total, "TPU").Whole());
        topo = Label(n, kTopo);
        break;
      }
    }
    if (node_chips <= 0) continue;
    tpu::SliceShape shape;
    shape.gen = pt->gen;
    shape.pod_type = p;
    shape.topology = topo;
    shape.chips = pt->chips;
    shape.chips_per_host = node_chips;
    shape.hosts = tpu::HostsOfSliceFromNode(node_chips, *pt);
    shape.single_host = shape.hosts == 1;
    for (auto& s : FindSlices(nodes, shape, std::nullopt)) out.push_back(s);
  }
  return out;
}

}  // namespace torus
