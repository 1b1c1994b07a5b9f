// Choosing nodes for the bundles of a placement group (pure; the head applies the result by
// prepare/commit on the chosen nodes). Strategies have Ray's meaning:
//   STRICT_PACK   all bundles on one node;
//   PACK          as few nodes as possible (one if it fits), else spill bundle by bundle;
//   STRICT_SPREAD every bundle on a different node;
//   SPREAD        different nodes where possible, else reuse the least-used one.
// Every bundle must also satisfy its label selector on its node. Thread-compatible.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/labels.h"
#include "common/resources.h"

namespace torus {

struct NodeView {
  std::string id;
  ResourceMap total;
  ResourceMap available;
  std::map<std::string, std::string> labels;
};

struct BundleDemand {
  ResourceMap resources;
  LabelSelectorTerms selector;
  int fixed_node = -1;  // already placed there (rescheduling keeps surviving bundles); -1 = place it
};

enum class PgStrategy { kPack, kSpread, kStrictPack, kStrictSpread };
bool ParsePgStrategy(const std::string& s, PgStrategy* out);

// Node index per bundle, charging `nodes[i].available` for newly placed bundles; nullopt (and
// nodes unchanged) when no placement exists right now. With use_total, plans against the
// nodes' totals instead: "could this ever be placed?".
std::optional<std::vector<int>> PlaceBundles(const std::vector<BundleDemand>& bundles,
                                             std::vector<NodeView>& nodes, PgStrategy strategy,
                                             bool use_total = false);

}  // namespace torus
