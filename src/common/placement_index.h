// The alive nodes the head places on (or a node spills lease requests to), indexed so that a
// placement decision (ordinary placement groups, actors, spillback) reads a few nodes instead of
// copying or scanning the node table: per resource, the nodes holding some of it grouped by
// amount (available, and total for "could this ever fit?"); per label key=value, the nodes
// carrying it. The owner keeps it current on every node change (Head::IndexNodeLocked:
// registration, heartbeat or bundle ledger, charge, death; a node's PeerView: each view snapshot
// or delta from the head).
//
// Candidate order (the one rule every decision follows): a demand's key resource is its
// resource the fewest indexed nodes have some of available (ties: lowest name id); candidates come with the
// most of the key resource first, then by slot (a node keeps its slot while indexed; freed slots
// are reused, lowest first). A demand with no positive amount has no key: candidates by slot.
// Only nodes whose free amounts (available or total) fit the demand and whose labels match its
// selector are candidates.
//
// Cost: O(log A) to find where the key resource's amounts reach the demand (A: distinct amounts),
// then O(1) per node visited; a selector with key=value (or `in`) terms visits only the nodes
// carrying those labels when they are fewer, and one on the node-id label only those nodes.
// Memory per idle node: its slot (16 B), 4 B per resource on each side and per label, plus the
// lists of resources and labels few nodes share (a slice's own resource and name label); a node
// whose available differs from its total also keeps a copy of it (so its old amounts can be
// found when it changes).
// Thread-compatible: the owner guards it with its mutex. Entries and id strings passed to Upsert
// stay valid (and their labels and totals unchanged) until Remove; the owner's `find` maps an id
// to its entry.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/labels.h"
#include "common/node_table.h"
#include "common/resources.h"

namespace torus {

class PlacementIndex {
 public:
  static constexpr uint32_t kNoSlot = 0xffffffffu;
  using Find = std::function<const NodeEntry*(std::string_view id)>;

  // A demand compiled against the index's name pool: positive amounts by name id (sorted),
  // the selector it must match, and whether it names a resource no node was ever seen with.
  struct Demand {
    CompactResources amounts;
    const LabelSelectorTerms* selector = nullptr;  // not owned; null: no selector
    bool impossible = false;
  };

  PlacementIndex(const NamePool& names, Find find) : names_(names), find_(std::move(find)) {}
  PlacementIndex(const PlacementIndex&) = delete;
  PlacementIndex& operator=(const PlacementIndex&) = delete;

  // Indexes node `id` with entry `n`'s resources and labels; for a node already indexed, takes
  // its new available amounts (its labels and totals must not change while indexed: Remove it
  // first). Sets n.placement_slot.
  void Upsert(const std::string& id, NodeEntry& n);
  void Remove(NodeEntry& n);
  size_t size() const { return count_; }

  Demand Compile(const ResourceMap& resources, const LabelSelectorTerms& selector) const;

  // Calls fn(slot) for each candidate of `d` in candidate order until fn returns false.
  void ForEach(const Demand& d, bool use_total, const std::function<bool(uint32_t)>& fn) const;
  // Whether slot `a` comes before slot `b` in `d`'s candidate order.
  bool Before(const Demand& d, bool use_total, uint32_t a, uint32_t b) const;
  // Whether slot's labels match `selector`.
  bool Matches(uint32_t slot, const LabelSelectorTerms& selector) const;

  // Whether `need` (positive amounts, by name id) fits in `free` (by name id).
  static bool FitsIn(const CompactResources& need, const CompactResources& free);

  // A node's free amounts (available or total), by name id.
  const CompactResources& Free(uint32_t slot, bool use_total) const;
  const std::string& Id(uint32_t slot) const { return *slots_[slot].id; }
  uint32_t SlotOf(std::string_view id) const;  // kNoSlot when not indexed

 private:
  struct Slot {
    const std::string* id = nullptr;  // null: free slot
    const NodeEntry* entry = nullptr;
  };
  // The available amounts indexed, for the slots whose available differs from their total
  // (for the others it is the entry's total).
  std::unordered_map<uint32_t, CompactResources> busy_;
  // The nodes holding some of one resource, by amount (most first), each list by slot.
  struct Holders {
    std::vector<std::pair<ResourceAmount, std::vector<uint32_t>>> by_amount;
    size_t nodes = 0;
  };
  using Side = std::unordered_map<uint32_t, Holders>;  // by resource name id

  const CompactResources& Indexed(uint32_t slot) const;  // the available amounts indexed
  void Enter(Side& side, const CompactResources& r, uint32_t slot);
  void Leave(Side& side, const CompactResources& r, uint32_t slot);
  // Moves slot between the holder lists of the resources whose amounts differ.
  void Move(Side& side, const CompactResources& from, const CompactResources& to, uint32_t slot);
  void IndexLabels(uint32_t slot, bool add);
  uint32_t KeyOf(const Demand& d) const;  // kNoSlot: none
  ResourceAmount KeyAmount(uint32_t key, bool use_total, uint32_t slot) const;
  bool Qualifies(const Demand& d, bool use_total, uint32_t slot) const;
  // The nodes `d`'s selector allows, when a key=value/in or node-id term narrows it to fewer
  // than `limit` nodes.
  std::optional<std::vector<uint32_t>> Narrowed(const Demand& d, size_t limit) const;

  const NamePool& names_;
  const Find find_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;  // a min-heap: the lowest free slot is reused first
  size_t count_ = 0;
  // Every node's available amounts; the totals of the nodes whose available differs from their
  // total (an idle node's totals are its available amounts: not entered twice).
  Side avail_, busy_total_;
  // (key id << 32 | value id) -> slots carrying it, sorted. Labels whose value is the node's
  // own id or hostname are not entered (a node-id term is answered through find_).
  std::unordered_map<uint64_t, std::vector<uint32_t>> by_label_;
  std::unordered_map<uint32_t, uint32_t> own_valued_keys_;  // label key -> nodes with such a value
};

}  // namespace torus
