// Choosing nodes for the bundles of a placement group (pure; the head applies the result by
// prepare/commit on the chosen nodes). Strategies have Ray's meaning:
//   STRICT_PACK   all bundles on one node;
//   PACK          as few nodes as possible (one if it fits), else spill bundle by bundle;
//   STRICT_SPREAD every bundle on a different node;
//   SPREAD        different nodes where possible, else reuse the least-used one.
// Every bundle must also satisfy its label selector on its node. A decision reads only the
// candidates the index yields (no scan of the node table). Thread-compatible.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/labels.h"
#include "common/resources.h"
#include "common/placement_index.h"

namespace torus {

// A node as slice queries read it (slices.h); placement decisions read the PlacementIndex.
struct NodeView {
  std::string id;
  ResourceMap total;
  ResourceMap available;
  std::map<std::string, std::string> labels;
};

struct BundleDemand {
  ResourceMap resources;
  LabelSelectorTerms selector;
  int fixed_node = -1;  // the index slot it is already placed on (rescheduling keeps surviving bundles); -1 = place it
};

enum class PgStrategy { kPack, kSpread, kStrictPack, kStrictSpread };
bool ParsePgStrategy(const std::string& s, PgStrategy* out);

// Index slot per bundle, or nullopt when no placement exists right now. Nodes are tried in the
// index's candidate order (placement_index.h), so among equally good nodes the one with the most
// of the bundle's key resource free wins. With use_total, plans against the nodes' totals
// instead: "could this ever be placed?". Charges nothing: the head's table changes when the
// nodes' ledgers come back.
std::optional<std::vector<int>> PlaceBundles(const std::vector<BundleDemand>& bundles,
                                             const PlacementIndex& nodes, PgStrategy strategy,
                                             bool use_total = false);

}  // namespace torus
