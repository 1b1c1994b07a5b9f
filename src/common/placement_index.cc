#include "common/placement_index.h"

#include <algorithm>

namespace torus {

namespace {

uint64_t LabelKey(uint32_t key, uint32_t value) { return (uint64_t{key} << 32) | value; }

void InsertSorted(std::vector<uint32_t>& v, uint32_t slot) {
  v.insert(std::lower_bound(v.begin(), v.end(), slot), slot);
}

void EraseSorted(std::vector<uint32_t>& v, uint32_t slot) {
  auto it = std::lower_bound(v.begin(), v.end(), slot);
  if (it != v.end() && *it == slot) v.erase(it);
}

ResourceAmount AmountOf(const CompactResources& r, uint32_t name) {
  auto it = std::lower_bound(r.begin(), r.end(), name, [](const auto& e, uint32_t n) { return e.first < n; });
  return it != r.end() && it->first == name ? it->second : ResourceAmount();
}

}  // namespace

bool PlacementIndex::FitsIn(const CompactResources& need, const CompactResources& free) {
  auto f = free.begin();
  for (const auto& [name, amount] : need) {
    while (f != free.end() && f->first < name) ++f;
    if (f == free.end() || f->first != name || f->second < amount) return false;
  }
  return true;
}

const CompactResources& PlacementIndex::Indexed(uint32_t slot) const {
  auto it = busy_.find(slot);
  return it != busy_.end() ? it->second : *slots_[slot].entry->total;
}

void PlacementIndex::Enter(Side& side, const CompactResources& r, uint32_t slot) {
  for (const auto& [name, amount] : r) {
    if (!amount.Positive()) continue;
    auto& holders = side[name];
    auto& lists = holders.by_amount;
    auto at = std::lower_bound(lists.begin(), lists.end(), amount,
                               [](const auto& e, ResourceAmount a) { return e.first > a; });
    if (at == lists.end() || at->first != amount) at = lists.insert(at, {amount, {}});
    InsertSorted(at->second, slot);
    ++holders.nodes;
  }
}

void PlacementIndex::Leave(Side& side, const CompactResources& r, uint32_t slot) {
  for (const auto& [name, amount] : r) {
    if (!amount.Positive()) continue;
    auto h = side.find(name);
    if (h == side.end()) continue;
    auto& lists = h->second.by_amount;
    auto it = std::lower_bound(lists.begin(), lists.end(), amount,
                               [](const auto& e, ResourceAmount a) { return e.first > a; });
    if (it == lists.end() || it->first != amount) continue;
    EraseSorted(it->second, slot);
    if (it->second.empty()) lists.erase(it);
    if (--h->second.nodes == 0) side.erase(h);
  }
}

void PlacementIndex::Move(Side& side, const CompactResources& from, const CompactResources& to, uint32_t slot) {
  // Only the resources whose amount changed move (a lease changes CPU, not the node's memory).
  CompactResources gone, added;
  auto a = from.begin(), b = to.begin();
  while (a != from.end() || b != to.end()) {
    if (b == to.end() || (a != from.end() && a->first < b->first)) {
      gone.push_back(*a++);
    } else if (a == from.end() || b->first < a->first) {
      added.push_back(*b++);
    } else {
      if (a->second != b->second) gone.push_back(*a), added.push_back(*b);
      ++a, ++b;
    }
  }
  Leave(side, gone, slot);
  Enter(side, added, slot);
}

void PlacementIndex::IndexLabels(uint32_t slot, bool add) {
  for (const auto& [key, value] : slots_[slot].entry->labels) {
    if (value == NodeEntry::kOwnId || value == NodeEntry::kOwnHostname) {
      auto& count = own_valued_keys_[key];
      if (add) {
        ++count;
      } else if (--count == 0) {
        own_valued_keys_.erase(key);
      }
      continue;
    }
    auto& v = by_label_[LabelKey(key, value)];
    if (add) {
      InsertSorted(v, slot);
    } else {
      EraseSorted(v, slot);
      if (v.empty()) by_label_.erase(LabelKey(key, value));
    }
  }
}

void PlacementIndex::Upsert(const std::string& id, NodeEntry& n) {
  // A node whose available equals its total keeps no copy: the entry's total is what is indexed.
  if (n.placement_slot != kNoSlot && n.placement_slot < slots_.size() && slots_[n.placement_slot].entry == &n) {
    // Same node, same labels and totals: its available amounts moved.
    uint32_t slot = n.placement_slot;
    Slot& s = slots_[slot];
    s.id = &id;
    const bool was_busy = busy_.count(slot) > 0;
    Move(avail_, Indexed(slot), n.Available(), slot);
    if (n.AvailableIsTotal()) {
      busy_.erase(slot);
      if (was_busy) Leave(busy_total_, *n.total, slot);
    } else {
      busy_[slot] = n.Available();
      if (!was_busy) Enter(busy_total_, *n.total, slot);
    }
    return;
  }
  uint32_t slot;
  if (!free_slots_.empty()) {
    std::pop_heap(free_slots_.begin(), free_slots_.end(), std::greater<uint32_t>());
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.emplace_back();
  }
  Slot& s = slots_[slot];
  s.id = &id;
  s.entry = &n;
  if (!n.AvailableIsTotal()) {
    busy_[slot] = n.Available();
    Enter(busy_total_, *n.total, slot);
  }
  n.placement_slot = slot;
  ++count_;
  Enter(avail_, n.Available(), slot);
  IndexLabels(slot, true);
}

void PlacementIndex::Remove(NodeEntry& n) {
  uint32_t slot = n.placement_slot;
  if (slot == kNoSlot || slot >= slots_.size() || slots_[slot].entry != &n) return;
  IndexLabels(slot, false);
  Leave(avail_, Indexed(slot), slot);
  if (busy_.count(slot)) Leave(busy_total_, *n.total, slot);
  slots_[slot] = Slot{};
  busy_.erase(slot);
  n.placement_slot = kNoSlot;
  --count_;
  free_slots_.push_back(slot);
  std::push_heap(free_slots_.begin(), free_slots_.end(), std::greater<uint32_t>());
}

uint32_t PlacementIndex::SlotOf(std::string_view id) const {
  const NodeEntry* n = find_(id);
  if (!n || n->placement_slot >= slots_.size() || slots_[n->placement_slot].entry != n) return kNoSlot;
  return n->placement_slot;
}

const CompactResources& PlacementIndex::Free(uint32_t slot, bool use_total) const {
  return use_total ? *slots_[slot].entry->total : Indexed(slot);
}

bool PlacementIndex::Matches(uint32_t slot, const LabelSelectorTerms& selector) const {
  if (selector.empty()) return true;
  const Slot& s = slots_[slot];
  return MatchesLabels(selector, NodeLabels{names_, *s.id, *s.entry});
}

PlacementIndex::Demand PlacementIndex::Compile(const ResourceMap& resources,
                                               const LabelSelectorTerms& selector) const {
  Demand d;
  d.selector = selector.empty() ? nullptr : &selector;
  for (const auto& [name, amount] : resources) {
    if (!amount.Positive()) continue;
    auto id = names_.Find(name);
    if (!id) {
      d.impossible = true;
      continue;
    }
    d.amounts.emplace_back(*id, amount);
  }
  std::sort(d.amounts.begin(), d.amounts.end());
  return d;
}

uint32_t PlacementIndex::KeyOf(const Demand& d) const {
  const Side& side = avail_;
  uint32_t key = kNoSlot;
  size_t fewest = 0;
  for (const auto& [name, amount] : d.amounts) {
    auto h = side.find(name);
    size_t holders = h == side.end() ? 0 : h->second.nodes;
    if (key == kNoSlot || holders < fewest) key = name, fewest = holders;
  }
  return key;
}

ResourceAmount PlacementIndex::KeyAmount(uint32_t key, bool use_total, uint32_t slot) const {
  return key == kNoSlot ? ResourceAmount() : AmountOf(Free(slot, use_total), key);
}

bool PlacementIndex::Before(const Demand& d, bool use_total, uint32_t a, uint32_t b) const {
  uint32_t key = KeyOf(d);
  ResourceAmount x = KeyAmount(key, use_total, a), y = KeyAmount(key, use_total, b);
  return x != y ? x > y : a < b;
}

bool PlacementIndex::Qualifies(const Demand& d, bool use_total, uint32_t slot) const {
  return FitsIn(d.amounts, Free(slot, use_total)) && (!d.selector || Matches(slot, *d.selector));
}

std::optional<std::vector<uint32_t>> PlacementIndex::Narrowed(const Demand& d, size_t limit) const {
  if (!d.selector) return std::nullopt;
  std::optional<std::vector<uint32_t>> best;
  for (const auto& t : *d.selector) {
    if (t.op != LabelCondition::Op::kEq && t.op != LabelCondition::Op::kIn) continue;
    std::vector<uint32_t> slots;
    if (t.key == kLabelNodeId) {
      for (const auto& v : t.values) {
        uint32_t s = SlotOf(v);
        if (s != kNoSlot) slots.push_back(s);
      }
    } else {
      auto key = names_.Find(t.key);
      if (!key) return std::vector<uint32_t>{};  // no node carries this label
      if (own_valued_keys_.count(*key)) continue;  // some values are not in by_label_
      for (const auto& v : t.values) {
        auto value = names_.Find(v);
        if (!value) continue;
        auto it = by_label_.find(LabelKey(*key, *value));
        if (it != by_label_.end()) slots.insert(slots.end(), it->second.begin(), it->second.end());
      }
    }
    if (slots.size() < limit && (!best || slots.size() < best->size())) best = std::move(slots);
  }
  if (best) {
    std::sort(best->begin(), best->end());
    best->erase(std::unique(best->begin(), best->end()), best->end());
  }
  return best;
}

namespace {

// Walks one side's lists of a resource (amount most first, then slot), optionally skipping
// slots: the merge in ForEach reads two of them at once.
class HolderCursor {
 public:
  using Lists = std::vector<std::pair<ResourceAmount, std::vector<uint32_t>>>;
  HolderCursor(const Lists* lists, std::function<bool(uint32_t)> skip) : lists_(lists), skip_(std::move(skip)) {
    Settle();
  }
  bool Valid() const { return lists_ && list_ < lists_->size(); }
  ResourceAmount Amount() const { return (*lists_)[list_].first; }
  uint32_t Slot() const { return (*lists_)[list_].second[pos_]; }
  void Next() {
    ++pos_;
    Settle();
  }
  // Whether this cursor's node comes first (more of the resource, then lower slot).
  bool Before(const HolderCursor& o) const {
    if (!o.Valid()) return true;
    return Amount() != o.Amount() ? Amount() > o.Amount() : Slot() < o.Slot();
  }

 private:
  void Settle() {  // onto the next slot not skipped
    while (Valid()) {
      const auto& slots = (*lists_)[list_].second;
      if (pos_ >= slots.size()) {
        ++list_, pos_ = 0;
      } else if (skip_ && skip_(slots[pos_])) {
        ++pos_;
      } else {
        return;
      }
    }
  }
  const Lists* lists_;
  std::function<bool(uint32_t)> skip_;
  size_t list_ = 0, pos_ = 0;
};

}  // namespace

void PlacementIndex::ForEach(const Demand& d, bool use_total, const std::function<bool(uint32_t)>& fn) const {
  if (d.impossible) return;
  uint32_t key = KeyOf(d);
  auto holders = key == kNoSlot ? avail_.end() : avail_.find(key);
  size_t visited = key == kNoSlot ? count_ : holders == avail_.end() ? 0 : holders->second.nodes;
  // Few nodes carry the selector's labels: those, sorted into candidate order.
  if (auto narrowed = Narrowed(d, use_total ? count_ : visited)) {
    std::vector<uint32_t> c;
    for (uint32_t slot : *narrowed) {
      if (Qualifies(d, use_total, slot)) c.push_back(slot);
    }
    std::sort(c.begin(), c.end(), [&](uint32_t a, uint32_t b) {
      ResourceAmount x = KeyAmount(key, use_total, a), y = KeyAmount(key, use_total, b);
      return x != y ? x > y : a < b;
    });
    for (uint32_t slot : c) {
      if (!fn(slot)) return;
    }
    return;
  }
  if (key == kNoSlot) {
    for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
      if (slots_[slot].id && Qualifies(d, use_total, slot) && !fn(slot)) return;
    }
    return;
  }
  const ResourceAmount need = AmountOf(d.amounts, key);
  auto lists = [](const Side& side, uint32_t name) -> const HolderCursor::Lists* {
    auto it = side.find(name);
    return it == side.end() ? nullptr : &it->second.by_amount;
  };
  if (!use_total) {
    for (HolderCursor c(lists(avail_, key), nullptr); c.Valid() && c.Amount() >= need; c.Next()) {
      if (Qualifies(d, false, c.Slot()) && !fn(c.Slot())) return;
    }
    return;
  }
  // Totals: an idle node's are its available amounts (the available side); a busy node's are
  // kept apart (busy_total_). Both in candidate order, merged.
  HolderCursor idle(lists(avail_, key), [this](uint32_t slot) { return busy_.count(slot) > 0; });
  HolderCursor busy(lists(busy_total_, key), nullptr);
  while (idle.Valid() || busy.Valid()) {
    HolderCursor& c = idle.Valid() && idle.Before(busy) ? idle : busy;
    if (c.Amount() < need) return;
    uint32_t slot = c.Slot();
    c.Next();
    if (Qualifies(d, true, slot) && !fn(slot)) return;
  }
}

}  // namespace torus
