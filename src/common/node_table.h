// The compact node entry the head keeps per registered node (and a node per peer in its view,
// node/peer_view.h), so that an idle node costs the head under 1 KiB (docs/benchmarks_scale.md):
// label keys and values and resource names are interned once in a NamePool shared by the table
// (a v6e host's dozen labels repeat across the cluster, or across the 4 hosts of a slice),
// resources are small sorted vectors instead of maps, a node's totals are interned in the same
// pool (the hosts of a group or a slice share one vector), and `available` is stored only while
// it differs from the totals.
// Records (rpc::NodeRecord) are built on demand for listings and heartbeat views.
// Thread-compatible: the owner (head, or a node's peer view) guards the pool and the entries
// with its mutex.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/resources.h"
#include "proto/torus.pb.h"

namespace torus {

using CompactResources = std::vector<std::pair<uint32_t, ResourceAmount>>;  // (name id, amount)

// Strings interned for good (name ids are dense and stable; Get() references stay valid), and
// sets of resource totals interned until RetainTotals frees those no entry uses any more
// (SweepTotals below). Not copyable.
class NamePool {
 public:
  NamePool() = default;
  ~NamePool();
  NamePool(const NamePool&) = delete;
  NamePool& operator=(const NamePool&) = delete;

  uint32_t Intern(std::string_view s);
  std::optional<uint32_t> Find(std::string_view s) const;  // without interning
  const std::string& Get(uint32_t id) const { return names_[id]; }
  size_t size() const { return names_.size(); }
  // The pool's one copy of `r` (sorted by name id, names interned here; amounts validated, so
  // never NaN); NoResources() when `r` is empty.
  const CompactResources* InternTotals(CompactResources r);
  static const CompactResources* NoResources();
  size_t TotalsSize() const { return totals_.size(); }
  // Frees every interned totals set not in `used`.
  void RetainTotals(const std::unordered_set<const CompactResources*>& used);

 private:
  struct TotalsHash {
    size_t operator()(const CompactResources* r) const;
  };
  struct TotalsEq {
    bool operator()(const CompactResources* a, const CompactResources* b) const { return *a == *b; }
  };
  std::deque<std::string> names_;
  std::unordered_map<std::string_view, uint32_t> ids_;  // views into names_
  std::unordered_set<const CompactResources*, TotalsHash, TotalsEq> totals_;  // owned
};

struct NodeEntry {
  // A label whose value is the node's own id or hostname is not interned (one-off strings).
  static constexpr uint32_t kOwnId = 0xffffffffu;
  static constexpr uint32_t kOwnHostname = 0xfffffffeu;

  std::string address;
  std::string hostname;
  std::vector<std::pair<uint32_t, uint32_t>> labels;  // (key id, value id)
  const CompactResources* total = NamePool::NoResources();  // interned in the owner's NamePool
  std::unique_ptr<CompactResources> available;  // null while the available amounts are the totals
  bool alive = false;
  bool known = false;               // registered at least once
  bool head_node = false;           // NodeRecord.is_head_node
  uint32_t placement_slot = 0xffffffffu;  // its slot in the owner's PlacementIndex (none: ~0)
  int64_t pid = 0;
  int64_t start_time_ms = 0;
  // What its lease queue waits for (the last heartbeat's pending demands); null when nothing.
  std::unique_ptr<std::vector<rpc::PendingDemand>> pending;
  std::chrono::steady_clock::time_point last_heartbeat;
  uint64_t ledger_seq = 0;          // of `available` (HeartbeatRequest.ledger_seq)
  uint32_t beat_ms = 0;             // the longer of the period it reported and the one it was told
  uint32_t reported_beat_ms = 0;    // the period the node reported (HeartbeatRequest.heartbeat_ms)

  const CompactResources& Total() const { return *total; }
  const CompactResources& Available() const { return available ? *available : *total; }
  bool AvailableIsTotal() const { return !available; }
};

// Frees the totals of `pool` that no entry of `nodes` (a map of id -> NodeEntry) points at, once
// the pool holds more than twice the sets left by the last sweep: hosts of new shapes that come
// and go cost O(1) amortised each, and the pool stays within twice the shapes in use. `*live`
// is the count the last sweep left.
template <typename Map>
void SweepTotals(NamePool& pool, const Map& nodes, size_t* live) {
  if (pool.TotalsSize() <= 2 * *live + 64) return;
  std::unordered_set<const CompactResources*> used;
  for (const auto& kv : nodes) used.insert(kv.second.total);
  pool.RetainTotals(used);
  *live = pool.TotalsSize();
}

// Sets `out` from a resource set.
void SetResources(NamePool& pool, const rpc::ResourceSet& in, CompactResources* out);
void SetResources(NamePool& pool, const ResourceMap& in, CompactResources* out);
// Equal amounts for the same names (no allocation).
bool SameResources(const NamePool& pool, const CompactResources& a, const rpc::ResourceSet& b);
ResourceMap ToResourceMap(const NamePool& pool, const CompactResources& r);
void ToProto(const NamePool& pool, const CompactResources& r, rpc::ResourceSet* out);
ResourceAmount Amount(const NamePool& pool, const CompactResources& r, std::string_view name);

// The node's available resources; stored apart only when they differ from its totals.
void SetAvailable(NamePool& pool, const rpc::ResourceSet& in, NodeEntry* n);
void SetAvailable(NamePool& pool, const ResourceMap& in, NodeEntry* n);
void SetAvailable(CompactResources in, NodeEntry* n);  // `in` sorted by name id

// Address, hostname, pid, labels, totals and available from a registration.
void SetFromRecord(NamePool& pool, const rpc::NodeRecord& rec, NodeEntry* n);

std::map<std::string, std::string> LabelsOf(const NamePool& pool, const std::string& node_id,
                                            const NodeEntry& n);
// One label's value, or null when absent (no copy).
const std::string* FindLabel(const NamePool& pool, const std::string& node_id, const NodeEntry& n,
                             std::string_view key);
// A node's labels as MatchesLabels reads a map (find, end, ->second), without building one.
struct NodeLabels {
  struct Hit {
    std::pair<std::string_view, std::string_view> kv;
    bool found = false;
    const std::pair<std::string_view, std::string_view>* operator->() const { return &kv; }
    bool operator==(const Hit& o) const { return found == o.found; }
    bool operator!=(const Hit& o) const { return found != o.found; }
  };
  const NamePool& pool;
  const std::string& node_id;
  const NodeEntry& n;
  Hit find(const std::string& key) const {
    const std::string* v = FindLabel(pool, node_id, n, key);
    return v ? Hit{{key, *v}, true} : Hit{};
  }
  Hit end() const { return Hit{}; }
};
// One label's value, "" when absent.
std::string LabelOf(const NamePool& pool, const std::string& node_id, const NodeEntry& n,
                    std::string_view key);

// The record of a node: for a heartbeat view (id, address, alive, resources, labels) or, with
// `full`, for listings (also hostname, pid, pending demands, start time).
void FillRecord(const NamePool& pool, const std::string& node_id, const NodeEntry& n, bool full,
                rpc::NodeRecord* out);

}  // namespace torus
