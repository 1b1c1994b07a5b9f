#include "common/node_table.h"

#include <algorithm>

namespace torus {

uint32_t NamePool::Intern(std::string_view s) {
  auto it = ids_.find(s);
  if (it != ids_.end()) return it->second;
  uint32_t id = static_cast<uint32_t>(names_.size());
  names_.emplace_back(s);
  ids_.emplace(std::string_view(names_.back()), id);
  return id;
}

std::optional<uint32_t> NamePool::Find(std::string_view s) const {
  auto it = ids_.find(s);
  if (it == ids_.end()) return std::nullopt;
  return it->second;
}

size_t NamePool::TotalsHash::operator()(const CompactResources* r) const {
  size_t h = r->size();
  for (const auto& [id, v] : *r) {
    h = h * 1000003u ^ std::hash<uint32_t>()(id);
    h = h * 1000003u ^ std::hash<int64_t>()(v.units());
  }
  return h;
}

NamePool::~NamePool() {
  for (const CompactResources* r : totals_) delete r;
}

const CompactResources* NamePool::InternTotals(CompactResources r) {
  if (r.empty()) return NoResources();
  auto it = totals_.find(&r);
  if (it != totals_.end()) return *it;
  r.shrink_to_fit();
  return *totals_.insert(new CompactResources(std::move(r))).first;
}

void NamePool::RetainTotals(const std::unordered_set<const CompactResources*>& used) {
  for (auto it = totals_.begin(); it != totals_.end();) {
    if (used.count(*it)) {
      ++it;
    } else {
      const CompactResources* r = *it;
      it = totals_.erase(it);  // before the delete: erasing may hash the element
      delete r;
    }
  }
}

const CompactResources* NamePool::NoResources() {
  static const CompactResources kNone;
  return &kNone;
}

namespace {
template <typename Map>
void SetResourcesFrom(NamePool& pool, const Map& in, CompactResources* out) {
  CompactResources r;
  r.reserve(in.size());
  for (const auto& [k, v] : in) r.emplace_back(pool.Intern(k), v);
  std::sort(r.begin(), r.end());
  *out = std::move(r);  // exact capacity: no slack kept per node
}

bool SameCompact(const CompactResources& a, const CompactResources& b) { return a == b; }
}  // namespace

void SetResources(NamePool& pool, const rpc::ResourceSet& in, CompactResources* out) {
  if (in.legacy_amounts().empty()) {
    CompactResources r;
    r.reserve(in.units_size());
    for (const auto& [k, u] : in.units()) r.emplace_back(pool.Intern(k), ResourceAmount::FromUnits(u));
    std::sort(r.begin(), r.end());
    *out = std::move(r);
    return;
  }
  SetResourcesFrom(pool, FromProto(in), out);
}

void SetResources(NamePool& pool, const ResourceMap& in, CompactResources* out) {
  SetResourcesFrom(pool, in, out);
}

bool SameResources(const NamePool& pool, const CompactResources& a, const rpc::ResourceSet& b) {
  if (!b.legacy_amounts().empty()) {
    ResourceMap m = FromProto(b);
    if (m.size() != a.size()) return false;
    for (const auto& [id, v] : a) {
      auto it = m.find(pool.Get(id));
      if (it == m.end() || it->second != v) return false;
    }
    return true;
  }
  if (static_cast<size_t>(b.units_size()) != a.size()) return false;
  for (const auto& [id, v] : a) {
    auto it = b.units().find(pool.Get(id));
    if (it == b.units().end() || it->second != v.units()) return false;
  }
  return true;
}

ResourceMap ToResourceMap(const NamePool& pool, const CompactResources& r) {
  ResourceMap m;
  for (const auto& [id, v] : r) m[pool.Get(id)] = v;
  return m;
}

void ToProto(const NamePool& pool, const CompactResources& r, rpc::ResourceSet* out) {
  out->mutable_legacy_amounts()->clear();
  auto* m = out->mutable_units();
  m->clear();
  for (const auto& [id, v] : r) (*m)[pool.Get(id)] = v.units();
}

ResourceAmount Amount(const NamePool& pool, const CompactResources& r, std::string_view name) {
  for (const auto& [id, v] : r) {
    if (pool.Get(id) == name) return v;
  }
  return ResourceAmount();
}

namespace {
void KeepAvailable(CompactResources r, NodeEntry* n) {
  if (SameCompact(r, *n->total)) {
    n->available.reset();
  } else if (n->available) {
    *n->available = std::move(r);
  } else {
    n->available = std::make_unique<CompactResources>(std::move(r));
  }
}
}  // namespace

void SetAvailable(NamePool& pool, const rpc::ResourceSet& in, NodeEntry* n) {
  CompactResources r;
  SetResources(pool, in, &r);
  KeepAvailable(std::move(r), n);
}

void SetAvailable(NamePool& pool, const ResourceMap& in, NodeEntry* n) {
  CompactResources r;
  SetResources(pool, in, &r);
  KeepAvailable(std::move(r), n);
}

void SetAvailable(CompactResources in, NodeEntry* n) { KeepAvailable(std::move(in), n); }

void SetFromRecord(NamePool& pool, const rpc::NodeRecord& rec, NodeEntry* n) {
  n->address = rec.address();
  n->hostname = rec.hostname();
  n->pid = rec.pid();
  n->head_node = rec.is_head_node();
  std::vector<std::pair<uint32_t, uint32_t>> labels;
  labels.reserve(rec.labels_size());
  for (const auto& [k, v] : rec.labels()) {
    uint32_t value = v == rec.node_id()                           ? NodeEntry::kOwnId
                     : !rec.hostname().empty() && v == rec.hostname() ? NodeEntry::kOwnHostname
                                                                      : pool.Intern(v);
    labels.emplace_back(pool.Intern(k), value);
  }
  n->labels = std::move(labels);
  CompactResources total;
  SetResources(pool, rec.total(), &total);
  n->total = pool.InternTotals(std::move(total));
  SetAvailable(pool, rec.available(), n);
}

namespace {
const std::string& LabelValue(const NamePool& pool, const std::string& node_id, const NodeEntry& n,
                              uint32_t v) {
  return v == NodeEntry::kOwnId ? node_id : v == NodeEntry::kOwnHostname ? n.hostname : pool.Get(v);
}
}  // namespace

std::map<std::string, std::string> LabelsOf(const NamePool& pool, const std::string& node_id,
                                            const NodeEntry& n) {
  std::map<std::string, std::string> out;
  for (const auto& [k, v] : n.labels) out.emplace(pool.Get(k), LabelValue(pool, node_id, n, v));
  return out;
}

const std::string* FindLabel(const NamePool& pool, const std::string& node_id, const NodeEntry& n,
                             std::string_view key) {
  for (const auto& [k, v] : n.labels) {
    if (pool.Get(k) == key) return &LabelValue(pool, node_id, n, v);
  }
  return nullptr;
}

std::string LabelOf(const NamePool& pool, const std::string& node_id, const NodeEntry& n,
                    std::string_view key) {
  for (const auto& [k, v] : n.labels) {
    if (pool.Get(k) == key) return LabelValue(pool, node_id, n, v);
  }
  return std::string();
}

void FillRecord(const NamePool& pool, const std::string& node_id, const NodeEntry& n, bool full,
                rpc::NodeRecord* out) {
  out->set_node_id(node_id);
  out->set_address(n.address);
  out->set_alive(n.alive);
  ToProto(pool, *n.total, out->mutable_total());
  ToProto(pool, n.Available(), out->mutable_available());
  auto* labels = out->mutable_labels();
  for (const auto& [k, v] : n.labels) (*labels)[pool.Get(k)] = LabelValue(pool, node_id, n, v);
  if (!full) return;
  out->set_hostname(n.hostname);
  out->set_pid(n.pid);
  out->set_is_head_node(n.head_node);
  out->set_start_time_ms(n.start_time_ms);
  out->set_heartbeat_ms(n.reported_beat_ms);
  if (n.pending) {
    for (const auto& d : *n.pending) *out->add_pending() = d;
  }
}

}  // namespace torus
