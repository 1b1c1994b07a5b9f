#include "head/placement.h"

#include <algorithm>
#include <functional>

namespace torus {

bool ParsePgStrategy(const std::string& s, PgStrategy* out) {
  if (s == "PACK") *out = PgStrategy::kPack;
  else if (s == "SPREAD") *out = PgStrategy::kSpread;
  else if (s == "STRICT_PACK") *out = PgStrategy::kStrictPack;
  else if (s == "STRICT_SPREAD") *out = PgStrategy::kStrictSpread;
  else return false;
  return true;
}

std::optional<std::vector<int>> PlaceBundles(const std::vector<BundleDemand>& bundles,
                                             std::vector<NodeView>& nodes, PgStrategy strategy,
                                             bool use_total) {
  const size_t n = nodes.size();
  std::vector<ResourceMap> free(n);
  for (size_t i = 0; i < n; ++i) free[i] = use_total ? nodes[i].total : nodes[i].available;
  std::vector<int> out(bundles.size(), -1);
  std::vector<int> used(n, 0);  // bundles of this group per node (fixed ones included)
  for (size_t b = 0; b < bundles.size(); ++b) {
    if (bundles[b].fixed_node >= 0) {
      out[b] = bundles[b].fixed_node;
      used[bundles[b].fixed_node]++;
    }
  }
  auto ok_on = [&](size_t b, size_t node) {
    return Fits(bundles[b].resources, free[node]) &&
           MatchesLabels(bundles[b].selector, nodes[node].labels);
  };
  auto commit = [&](std::vector<ResourceMap>& f) {
    if (!use_total) {
      for (size_t b = 0; b < bundles.size(); ++b) {
        if (bundles[b].fixed_node < 0) Subtract(nodes[out[b]].available, bundles[b].resources);
      }
    }
    (void)f;
    return out;
  };

  if (strategy == PgStrategy::kStrictPack) {
    // One node for everything (the node of an already-placed bundle, if any).
    int fixed = -1;
    for (const auto& b : bundles) {
      if (b.fixed_node >= 0) fixed = b.fixed_node;
    }
    for (size_t node = 0; node < n; ++node) {
      if (fixed >= 0 && static_cast<int>(node) != fixed) continue;
      ResourceMap f = free[node];
      bool all = true;
      for (size_t b = 0; b < bundles.size() && all; ++b) {
        if (bundles[b].fixed_node >= 0) continue;
        if (!Fits(bundles[b].resources, f) || !MatchesLabels(bundles[b].selector, nodes[node].labels)) {
          all = false;
        } else {
          Subtract(f, bundles[b].resources);
        }
      }
      if (all) {
        for (size_t b = 0; b < bundles.size(); ++b) out[b] = static_cast<int>(node);
        return commit(free);
      }
    }
    return std::nullopt;
  }

  if (strategy == PgStrategy::kStrictSpread) {
    // Distinct nodes: depth-first search with a step budget (greedy is not enough when
    // selectors or sizes make some nodes usable only by some bundles).
    std::vector<size_t> order;
    for (size_t b = 0; b < bundles.size(); ++b) {
      if (bundles[b].fixed_node < 0) order.push_back(b);
    }
    // Most constrained first: bundles with fewer candidate nodes.
    std::vector<int> candidates(bundles.size(), 0);
    for (size_t b : order) {
      for (size_t node = 0; node < n; ++node) candidates[b] += ok_on(b, node) && used[node] == 0;
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return candidates[a] < candidates[b]; });
    long budget = 200000;
    // Nodes with the most room left first: keeps capacity balanced, so later groups still find
    // enough distinct nodes.
    auto headroom = [&](size_t b, size_t node) {
      double h = 1e300;
      for (const auto& [k, v] : bundles[b].resources) {
        auto it = free[node].find(k);
        h = std::min(h, (it == free[node].end() ? 0.0 : it->second) - v);
      }
      return h;
    };
    std::function<bool(size_t)> dfs = [&](size_t k) -> bool {
      if (k == order.size()) return true;
      size_t b = order[k];
      std::vector<size_t> by_room(n);
      for (size_t i = 0; i < n; ++i) by_room[i] = i;
      std::stable_sort(by_room.begin(), by_room.end(),
                       [&](size_t x, size_t y) { return headroom(b, x) > headroom(b, y); });
      for (size_t node : by_room) {
        if (--budget < 0) return false;
        if (used[node] || !ok_on(b, node)) continue;
        used[node] = 1;
        out[b] = static_cast<int>(node);
        if (dfs(k + 1)) return true;
        used[node] = 0;
        out[b] = -1;
      }
      return false;
    };
    if (!dfs(0)) return std::nullopt;
    return commit(free);
  }

  // PACK and SPREAD: greedy, bundle by bundle.
  if (strategy == PgStrategy::kPack) {
    // First try one node for all of them.
    std::vector<BundleDemand> copy = bundles;
    std::vector<NodeView> trial = nodes;
    auto one = PlaceBundles(copy, trial, PgStrategy::kStrictPack, use_total);
    if (one) {
      if (!use_total) nodes = trial;
      return one;
    }
  }
  for (size_t b = 0; b < bundles.size(); ++b) {
    if (bundles[b].fixed_node >= 0) continue;
    int best = -1;
    for (size_t node = 0; node < n; ++node) {
      if (!ok_on(b, node)) continue;
      if (best < 0) {
        best = static_cast<int>(node);
        continue;
      }
      bool better = strategy == PgStrategy::kPack ? used[node] > used[best] : used[node] < used[best];
      if (better) best = static_cast<int>(node);
    }
    if (best < 0) return std::nullopt;
    out[b] = best;
    used[best]++;
    Subtract(free[best], bundles[b].resources);
  }
  return commit(free);
}

}  // namespace torus
