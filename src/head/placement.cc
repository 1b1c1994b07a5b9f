#include "head/placement.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

namespace torus {

bool ParsePgStrategy(const std::string& s, PgStrategy* out) {
  if (s == "PACK") *out = PgStrategy::kPack;
  else if (s == "SPREAD") *out = PgStrategy::kSpread;
  else if (s == "STRICT_PACK") *out = PgStrategy::kStrictPack;
  else if (s == "STRICT_SPREAD") *out = PgStrategy::kStrictSpread;
  else return false;
  return true;
}

namespace {

using Demand = PlacementIndex::Demand;

// One placement decision (PlaceBundles' steps). Reads the index's candidates; what this group
// has taken so far is kept aside per node (free_), so the index itself is never changed.
class BundlePlacer {
 public:
  BundlePlacer(const std::vector<BundleDemand>& bundles, const PlacementIndex& nodes, bool use_total)
      : bundles_(bundles), nodes_(nodes), use_total_(use_total), out_(bundles.size(), -1) {
    for (size_t b = 0; b < bundles.size(); ++b) {
      // Bundles asking what the one before asked (a 64-bundle group is often 64 equal bundles)
      // share its compiled demand.
      if (b > 0 && SameAsked(b, b - 1)) {
        demands_.push_back(demands_.back());
      } else {
        demands_.push_back(nodes.Compile(bundles[b].resources, bundles[b].selector));
      }
    }
    for (size_t b = 0; b < bundles.size(); ++b) {
      if (bundles[b].fixed_node >= 0) {
        out_[b] = bundles[b].fixed_node;
        used_[static_cast<uint32_t>(bundles[b].fixed_node)]++;
      }
    }
  }

  // STRICT_PACK: one node for everything (the node of an already-placed bundle, if any).
  bool StrictPack() {
    int fixed = -1;
    ResourceMap sum;
    LabelSelectorTerms all;
    for (const auto& b : bundles_) {
      if (b.fixed_node >= 0) {
        fixed = b.fixed_node;
        continue;
      }
      Add(sum, b.resources);
      all.insert(all.end(), b.selector.begin(), b.selector.end());
    }
    Demand d = nodes_.Compile(sum, all);
    int chosen = -1;
    if (fixed >= 0) {
      uint32_t slot = static_cast<uint32_t>(fixed);
      if (!d.impossible && PlacementIndex::FitsIn(d.amounts, nodes_.Free(slot, use_total_)) &&
          nodes_.Matches(slot, all)) {
        chosen = fixed;
      }
    } else {
      nodes_.ForEach(d, use_total_, [&](uint32_t slot) {
        chosen = static_cast<int>(slot);
        return false;
      });
    }
    if (chosen < 0) return false;
    for (size_t b = 0; b < bundles_.size(); ++b) out_[b] = chosen;
    return true;
  }

  // STRICT_SPREAD: distinct nodes, by depth-first search with a step budget (greedy is not
  // enough when selectors or sizes make some nodes usable only by some bundles).
  bool StrictSpread() {
    std::vector<size_t> order = MostConstrainedFirst();
    if (!EnoughDistinctNodes(order)) return false;
    long budget = 200000;
    return Spread(order, 0, &budget);
  }

  // PACK and SPREAD after the one-node try: greedy, bundle by bundle, onto the node holding the
  // most (PACK) or fewest (SPREAD) bundles of the group so far; among equals, the first in
  // candidate order. Only the nodes already used and the first fitting unused one are read
  // (SPREAD reads the used ones only when no unused one fits).
  bool Greedy(PgStrategy strategy) {
    const bool pack = strategy == PgStrategy::kPack;
    for (size_t b = 0; b < bundles_.size(); ++b) {
      if (bundles_[b].fixed_node >= 0) continue;
      // An unused node beats every used one for SPREAD: the used ones are read only when no
      // unused node fits.
      if (int unused = pack ? -1 : NextUnused(b); unused >= 0) {
        Take(b, static_cast<uint32_t>(unused));
        continue;
      }
      const Demand& d = demands_[b];
      int best = -1, best_count = 0;
      for (const auto& [slot, count] : used_) {
        if (!FitsNow(b, slot)) continue;
        int s = static_cast<int>(slot);
        bool better = best < 0 || (pack ? count > best_count : count < best_count) ||
                      (count == best_count && nodes_.Before(d, use_total_, slot, static_cast<uint32_t>(best)));
        if (better) best = s, best_count = count;
      }
      // An unused node is PACK's choice only when no used node fits.
      if (pack && best < 0) best = FirstUnused(b);
      if (best < 0) return false;
      Take(b, static_cast<uint32_t>(best));
    }
    return true;
  }

  const std::vector<int>& Result() const { return out_; }

 private:
  const CompactResources& FreeOf(uint32_t slot) const {
    auto it = free_.find(slot);
    return it != free_.end() ? it->second : nodes_.Free(slot, use_total_);
  }

  bool FitsNow(size_t b, uint32_t slot) const {
    const Demand& d = demands_[b];
    return !d.impossible && PlacementIndex::FitsIn(d.amounts, FreeOf(slot)) &&
           nodes_.Matches(slot, bundles_[b].selector);
  }

  // Whether bundles a and b ask for the same resources with the same selector.
  bool SameAsked(size_t a, size_t b) const {
    const auto& x = bundles_[a].selector;
    const auto& y = bundles_[b].selector;
    if (bundles_[a].resources != bundles_[b].resources || x.size() != y.size()) return false;
    for (size_t i = 0; i < x.size(); ++i) {
      if (x[i].key != y[i].key || x[i].op != y[i].op || x[i].values != y[i].values) return false;
    }
    return true;
  }

  // SPREAD's first unused candidate of bundle b, as FirstUnused(b), in O(1) amortised over a run
  // of bundles asking the same: the run's unused candidates are read once, in candidate order,
  // as many as the run has bundles (the index does not change during a decision and this
  // group's use only grows, so each bundle of the run starts where the one before stopped).
  int NextUnused(size_t b) {
    if (run_first_ < 0 || !SameAsked(b, static_cast<size_t>(run_first_))) {
      run_first_ = static_cast<int>(b);
      run_.clear();
      run_pos_ = 0;
      size_t want = 0;
      for (size_t k = b; k < bundles_.size(); ++k) {
        if (bundles_[k].fixed_node >= 0) continue;
        if (!SameAsked(k, b)) break;
        ++want;
      }
      nodes_.ForEach(demands_[b], use_total_, [&](uint32_t slot) {
        if (!used_.count(slot)) run_.push_back(slot);
        return run_.size() < want;
      });
    }
    while (run_pos_ < run_.size()) {
      uint32_t slot = run_[run_pos_++];
      if (!used_.count(slot)) return static_cast<int>(slot);
    }
    return -1;
  }

  // The first candidate of bundle b that this group has not used (its free amounts untouched).
  int FirstUnused(size_t b) const {
    int found = -1;
    nodes_.ForEach(demands_[b], use_total_, [&](uint32_t slot) {
      if (used_.count(slot)) return true;
      found = static_cast<int>(slot);
      return false;
    });
    return found;
  }

  void Take(size_t b, uint32_t slot) {
    out_[b] = static_cast<int>(slot);
    used_[slot]++;
    auto [it, fresh] = free_.try_emplace(slot);
    if (fresh) it->second = nodes_.Free(slot, use_total_);
    for (const auto& [name, amount] : demands_[b].amounts) {
      for (auto& [have, left] : it->second) {
        if (have == name) left -= amount;
      }
    }
  }

  // Unused candidates of bundle b, counted up to `cap`.
  size_t CountUnused(size_t b, size_t cap) const {
    size_t n = 0;
    nodes_.ForEach(demands_[b], use_total_, [&](uint32_t slot) {
      if (!used_.count(slot)) ++n;
      return n < cap;
    });
    return n;
  }

  // The bundles to place, those with fewer candidate nodes first (counts saturate at one more
  // than the bundles to place: beyond that, any order succeeds as easily).
  std::vector<size_t> MostConstrainedFirst() const {
    std::vector<size_t> order;
    for (size_t b = 0; b < bundles_.size(); ++b) {
      if (bundles_[b].fixed_node < 0) order.push_back(b);
    }
    std::vector<size_t> candidates(bundles_.size(), 0);
    for (size_t b : order) candidates[b] = CountUnused(b, order.size() + 1);
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t b) { return candidates[a] < candidates[b]; });
    return order;
  }

  // Fewer distinct unused nodes among all the bundles' candidates than bundles: no search.
  bool EnoughDistinctNodes(const std::vector<size_t>& order) const {
    std::unordered_set<uint32_t> seen;
    for (size_t b : order) {
      size_t mine = 0;
      nodes_.ForEach(demands_[b], use_total_, [&](uint32_t slot) {
        if (used_.count(slot)) return true;
        seen.insert(slot);
        return ++mine < order.size() && seen.size() < order.size();
      });
      if (mine == 0) return false;
      if (seen.size() >= order.size()) return true;
    }
    return seen.size() >= order.size();
  }

  // Places order[k..] on distinct unused nodes, each bundle's candidates in candidate order
  // (the most of its key resource free first: that keeps capacity balanced, so later groups
  // still find enough distinct nodes).
  bool Spread(const std::vector<size_t>& order, size_t k, long* budget) {
    if (k == order.size()) return true;
    size_t b = order[k];
    bool done = false;
    nodes_.ForEach(demands_[b], use_total_, [&](uint32_t slot) {
      if (--*budget < 0) return false;
      if (used_.count(slot)) return true;
      used_[slot] = 1;
      out_[b] = static_cast<int>(slot);
      if (Spread(order, k + 1, budget)) {
        done = true;
        return false;
      }
      used_.erase(slot);
      out_[b] = -1;
      return true;
    });
    return done;
  }

  const std::vector<BundleDemand>& bundles_;
  const PlacementIndex& nodes_;
  const bool use_total_;
  std::vector<Demand> demands_;                          // per bundle, compiled
  std::vector<int> out_;                                 // slot per bundle (-1: not placed yet)
  std::unordered_map<uint32_t, int> used_;               // bundles of this group per slot
  std::unordered_map<uint32_t, CompactResources> free_;  // what this group left on nodes it used
  // NextUnused's run: its first bundle (-1: none yet), its unused candidates, the next to try.
  int run_first_ = -1;
  std::vector<uint32_t> run_;
  size_t run_pos_ = 0;
};

}  // namespace

std::optional<std::vector<int>> PlaceBundles(const std::vector<BundleDemand>& bundles,
                                             const PlacementIndex& nodes, PgStrategy strategy,
                                             bool use_total) {
  BundlePlacer placer(bundles, nodes, use_total);
  switch (strategy) {
    case PgStrategy::kStrictPack:
      if (!placer.StrictPack()) return std::nullopt;
      return placer.Result();
    case PgStrategy::kStrictSpread:
      if (!placer.StrictSpread()) return std::nullopt;
      return placer.Result();
    case PgStrategy::kPack: {
      // First try one node for all of them.
      BundlePlacer one(bundles, nodes, use_total);
      if (one.StrictPack()) return one.Result();
      break;
    }
    case PgStrategy::kSpread:
      break;
  }
  if (!placer.Greedy(strategy)) return std::nullopt;
  return placer.Result();
}

}  // namespace torus
