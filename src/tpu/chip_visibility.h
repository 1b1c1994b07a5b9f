// Worker chip visibility (docs/tpu.md §7): which TPU_* variables a worker process granted TPU
// chips gets, and which inherited ones it loses. Pure functions; safe from any thread.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace torus::tpu {

inline constexpr std::string_view kEnvVisibleChips = "TPU_VISIBLE_CHIPS";
inline constexpr std::string_view kEnvChipsPerHostBounds = "TPU_CHIPS_PER_HOST_BOUNDS";
inline constexpr std::string_view kEnvHostBounds = "TPU_HOST_BOUNDS";
inline constexpr std::string_view kEnvNosetVisibleChips = "TORUS_NOSET_TPU_VISIBLE_CHIPS";
inline constexpr std::string_view kEnvRayNosetVisibleChips =
    "RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS";

// Changes to apply to a worker's inherited environment: first remove `unset`, then apply `set`.
// The two never name the same variable.
struct EnvChanges {
  std::map<std::string, std::string> set;
  std::vector<std::string> unset;  // sorted

  bool empty() const { return set.empty() && unset.empty(); }
  // Applies the changes to `env` in place.
  void ApplyTo(std::map<std::string, std::string>* env) const;
};

// Truthy = after trimming, case-insensitively one of "1", "true", "yes", "on". Everything else
// (unset, "", "0", "false", "no", "off", garbage) is false.
bool IsTruthy(std::string_view value);

// True when TORUS_NOSET_TPU_VISIBLE_CHIPS or RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS in `env`
// is truthy.
bool VisibilityOptOut(const std::map<std::string, std::string>& env);

// The §7 rules for a worker granted `granted_chip_ids` (physical ids, any order; duplicates are
// ignored) on a node with `node_chips` chips:
//  - opt_out, or no chips granted: no changes at all;
//  - whole host (granted count >= node_chips): remove TPU_CHIPS_PER_HOST_BOUNDS and
//    TPU_HOST_BOUNDS; TPU_VISIBLE_CHIPS is left as inherited (a node capped by its own
//    TPU_VISIBLE_CHIPS passes that list on), never set;
//  - otherwise TPU_VISIBLE_CHIPS = ids ascending, comma-joined; with 1 chip also
//    TPU_CHIPS_PER_HOST_BOUNDS=1,1,1 and TPU_HOST_BOUNDS=1,1,1; with 2 chips 1,2,1 and 1,1,1;
//    any other partial grant sets only TPU_VISIBLE_CHIPS (spec: "to confirm").
EnvChanges ComputeChipVisibility(int node_chips, const std::vector<int>& granted_chip_ids,
                                 bool opt_out);

// A task or actor may request TPU 0 (none), 1, 2, 4 or 8. Anything else (0.5, 3, negative, NaN)
// is InvalidArgument "TPU request must be 1, 2, 4 or 8".
Status ValidateTaskTpuRequest(double amount);

}  // namespace torus::tpu
