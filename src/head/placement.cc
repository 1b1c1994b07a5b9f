#include "head/placement.h"

#include <algorithm>

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

// One placement decision over a copy of the nodes' free resources (PlaceBundles' steps).
class BundlePlacer {
 public:
  BundlePlacer(const std::vector<BundleDemand>& bundles, std::vector<NodeView>& nodes, bool use_total)
      : bundles_(bundles), nodes_(nodes), use_total_(use_total), n_(nodes.size()),
        free_(n_), out_(bundles.size(), -1), used_(n_, 0) {
    for (size_t i = 0; i < n_; ++i) free_[i] = use_total ? nodes[i].total : nodes[i].available;
    for (size_t b = 0; b < bundles.size(); ++b) {
      if (bundles[b].fixed_node >= 0) {
        out_[b] = bundles[b].fixed_node;
        used_[bundles[b].fixed_node]++;
      }
    }
  }

  // STRICT_PACK: one node for everything (the node of an already-placed bundle, if any).
  bool StrictPack() {
    int fixed = -1;
    for (const auto& b : bundles_) {
      if (b.fixed_node >= 0) fixed = b.fixed_node;
    }
    for (size_t node = 0; node < n_; ++node) {
      if (fixed >= 0 && static_cast<int>(node) != fixed) continue;
      if (!AllFitOn(node)) continue;
      for (size_t b = 0; b < bundles_.size(); ++b) out_[b] = static_cast<int>(node);
      return true;
    }
    return false;
  }

  // STRICT_SPREAD: distinct nodes, by depth-first search with a step budget (greedy is not
  // enough when selectors or sizes make some nodes usable only by some bundles).
  bool StrictSpread() {
    std::vector<size_t> order = MostConstrainedFirst();
    long budget = 200000;
    return Spread(order, 0, &budget);
  }

  // PACK and SPREAD after the one-node try: greedy, bundle by bundle, onto the node holding the
  // most (PACK) or fewest (SPREAD) bundles of the group so far.
  bool Greedy(PgStrategy strategy) {
    for (size_t b = 0; b < bundles_.size(); ++b) {
      if (bundles_[b].fixed_node >= 0) continue;
      int best = -1;
      for (size_t node = 0; node < n_; ++node) {
        // The cheap comparison first: only a node that would beat the best so far is checked
        // for fit (SPREAD: after the first unused node that fits, no other is).
        bool better = best < 0 || (strategy == PgStrategy::kPack ? used_[node] > used_[best]
                                                                 : used_[node] < used_[best]);
        if (better && OkOn(b, node)) best = static_cast<int>(node);
      }
      if (best < 0) return false;
      out_[b] = best;
      used_[best]++;
      Subtract(free_[best], bundles_[b].resources);
    }
    return true;
  }

  // The decision: charges the nodes' available resources for the new bundles (unless planning
  // against totals) and returns the node per bundle.
  std::vector<int> Commit() {
    if (!use_total_) {
      for (size_t b = 0; b < bundles_.size(); ++b) {
        if (bundles_[b].fixed_node < 0) Subtract(nodes_[out_[b]].available, bundles_[b].resources);
      }
    }
    return out_;
  }

 private:
  bool OkOn(size_t b, size_t node) const {
    return Fits(bundles_[b].resources, free_[node]) && MatchesLabels(bundles_[b].selector, nodes_[node].labels);
  }

  // Every bundle not placed yet fits on `node` together.
  bool AllFitOn(size_t node) const {
    ResourceMap f = free_[node];
    for (const auto& b : bundles_) {
      if (b.fixed_node >= 0) continue;
      if (!Fits(b.resources, f) || !MatchesLabels(b.selector, nodes_[node].labels)) return false;
      Subtract(f, b.resources);
    }
    return true;
  }

  // The bundles to place, those with fewer candidate nodes first.
  std::vector<size_t> MostConstrainedFirst() const {
    std::vector<size_t> order;
    for (size_t b = 0; b < bundles_.size(); ++b) {
      if (bundles_[b].fixed_node < 0) order.push_back(b);
    }
    std::vector<int> candidates(bundles_.size(), 0);
    for (size_t b : order) {
      for (size_t node = 0; node < n_; ++node) candidates[b] += OkOn(b, node) && used_[node] == 0;
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return candidates[a] < candidates[b]; });
    return order;
  }

  // Room left on `node` for bundle b's tightest resource.
  double Headroom(size_t b, size_t node) const {
    double h = 1e300;
    for (const auto& [k, v] : bundles_[b].resources) {
      auto it = free_[node].find(k);
      h = std::min(h, (it == free_[node].end() ? 0.0 : it->second) - v);
    }
    return h;
  }

  // Places order[k..] on distinct unused nodes. Nodes with the most room left are tried first:
  // that keeps capacity balanced, so later groups still find enough distinct nodes.
  bool Spread(const std::vector<size_t>& order, size_t k, long* budget) {
    if (k == order.size()) return true;
    size_t b = order[k];
    std::vector<size_t> by_room(n_);
    for (size_t i = 0; i < n_; ++i) by_room[i] = i;
    std::stable_sort(by_room.begin(), by_room.end(),
                     [&](size_t x, size_t y) { return Headroom(b, x) > Headroom(b, y); });
    for (size_t node : by_room) {
      if (--*budget < 0) return false;
      if (used_[node] || !OkOn(b, node)) continue;
      used_[node] = 1;
      out_[b] = static_cast<int>(node);
      if (Spread(order, k + 1, budget)) return true;
      used_[node] = 0;
      out_[b] = -1;
    }
    return false;
  }

  const std::vector<BundleDemand>& bundles_;
  std::vector<NodeView>& nodes_;
  const bool use_total_;
  const size_t n_;
  std::vector<ResourceMap> free_;  // what each node has left for this group
  std::vector<int> out_;           // node per bundle (-1: not placed yet)
  std::vector<int> used_;          // bundles of this group per node (fixed ones included)
};

}  // namespace

std::optional<std::vector<int>> PlaceBundles(const std::vector<BundleDemand>& bundles,
                                             std::vector<NodeView>& nodes, PgStrategy strategy,
                                             bool use_total) {
  BundlePlacer placer(bundles, nodes, use_total);
  switch (strategy) {
    case PgStrategy::kStrictPack:
      if (!placer.StrictPack()) return std::nullopt;
      return placer.Commit();
    case PgStrategy::kStrictSpread:
      if (!placer.StrictSpread()) return std::nullopt;
      return placer.Commit();
    case PgStrategy::kPack: {
      // First try one node for all of them.
      std::vector<NodeView> trial = nodes;
      if (auto one = PlaceBundles(bundles, trial, PgStrategy::kStrictPack, use_total)) {
        if (!use_total) nodes = std::move(trial);
        return one;
      }
      break;
    }
    case PgStrategy::kSpread:
      break;
  }
  if (!placer.Greedy(strategy)) return std::nullopt;
  return placer.Commit();
}

}  // namespace torus
