// RayConfig::head_args (`ray start` arguments, also from --ray_head_args) applied to the node of
// the embedded default cluster: --num-cpus N, --num-gpus N, --resources JSON,
// --object-store-memory BYTES, --labels JSON. Pure function; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "node/node.h"

namespace torus::embedded {

// Throws internal::RayException naming any other argument or a malformed value.
void ApplyHeadArgs(const std::vector<std::string>& head_args, NodeConfig* node);

}  // namespace torus::embedded
