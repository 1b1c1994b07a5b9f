// TPU slices as the head sees them: nodes grouped by their slice labels (docs/tpu.md sections 4
// and 6 "Cluster queries"), and the choice of whole idle slices for a reservation. Pure;
// thread-compatible.
#pragma once

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "head/placement.h"
#include "head/slice_idle.h"
#include "tpu/topology.h"

namespace torus {

struct SliceView {
  std::string name;               // slice name, or the node id of an anonymous single-host slice
  std::string pod_type;
  std::string topology;
  int hosts_expected = 0;
  std::vector<int> hosts;         // node index per worker id (-1 = missing)
  bool intact = false;
  bool idle = false;              // SliceIdleRule::SliceIdle
};

// A node's TPU chips and head unit of `pod_type`, as the idle rule reads them.
SliceHostUse SliceHostUseOf(const NodeView& n, const std::string& pod_type);

// Every slice of pod type `shape.pod_type` among `nodes` (alive nodes only). With
// chips_per_vm, a slice counts as intact only when every host has exactly that many chips.
std::vector<SliceView> FindSlices(const std::vector<NodeView>& nodes, const tpu::SliceShape& shape,
                                  std::optional<int> chips_per_vm);
// Every slice of any pod type (for listings): groups by slice name.
std::vector<SliceView> AllSlices(const std::vector<NodeView>& nodes);

}  // namespace torus
