// TPU topology model: generations, topologies, pod types, slice shapes and reservation bundle
// layout (docs/tpu.md §2, §3, §6 "Bundle shape and count"), plus (from common/tpu_labels.h)
// the TPU label keys of §4.
//
// Everything here is a pure function of its arguments: no I/O, no global state, safe to call from
// any thread. Inputs come from users, environment variables and other processes, so every
// malformed input is answered with an InvalidArgument Status, never a crash.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/tpu_labels.h"

namespace torus::tpu {

// ---------------------------------------------------------------------------------------------
// Generations (§2)
// ---------------------------------------------------------------------------------------------

enum class Generation { kV2, kV3, kV4, kV5p, kV5litepod, kV6e, kV7x };

// All seven generations, oldest first.
const std::vector<Generation>& AllGenerations();

// Resolves any accepted spelling of a version: "TPU-V4", "tpu7x", "tpu-v6e", "v4-4" (a trailing
// "-<digits>" size suffix is ignored), "v5e" (alias of v5litepod, a Torus extension).
// Error: InvalidArgument "Invalid accelerator_type '<v>'; valid versions: ..." quoting the input.
StatusOr<Generation> NormalizeVersion(std::string_view version);

// "v2", "v3", "v4", "v5p", "v5litepod", "v6e", "v7x".
std::string CanonicalName(Generation gen);

// The accelerator-type label/resource value: "TPU-" + upper-cased canonical name ("TPU-V6E").
std::string AcceleratorTypeValue(Generation gen);

// TensorCores per chip: 1 on v5litepod and v6e, 2 otherwise (a v7x chip's two chiplets).
int CoresPerChip(Generation gen);

// True for generations whose topologies are AxBxC (v4, v5p, v7x).
bool Is3D(Generation gen);

// Values of the GKE node label `cloud.google.com/gke-tpu-accelerator` for this generation, in the
// §2 table's order; empty for v2 and v3 (GCE only).
std::vector<std::string> GkeAcceleratorValues(Generation gen);

// Inverse of GkeAcceleratorValues (exact, case-sensitive match, as GKE label values are);
// nullopt for an unknown value such as "tpu-v3-slice".
std::optional<Generation> GenerationFromGkeAccelerator(std::string_view gke_value);

// ---------------------------------------------------------------------------------------------
// Topologies (§2, §3.1)
// ---------------------------------------------------------------------------------------------

// Trims, lowercases and splits on 'x'. Requires 2 or 3 parts, each a positive decimal integer,
// and a chip product that fits in an int. Error: InvalidArgument "Invalid topology '<t>'".
// An empty topology is an error here; callers that read "" as "unknown" check for it first.
StatusOr<std::vector<int>> ParseTopology(std::string_view topology);

// Product of the parsed dimensions. Same errors as ParseTopology.
StatusOr<int> TopologyChips(std::string_view topology);

// Trimmed, lowercased form ("2X2X4 " -> "2x2x4"), without validation.
std::string NormalizeTopology(std::string_view topology);

// OK when the topology parses (§3.1) and its normalised form is in ValidTopologies(gen).
// Dimension order matters: 2x2x4 is valid for v4, 4x2x2 is not.
// Errors: "Invalid topology '<t>'" (does not parse) or
// "Invalid accelerator topology: '<t>' for accelerator version: '<v>'" (parses, not in the set).
Status ValidateTopology(Generation gen, std::string_view topology);

// The version's valid topologies in a fixed order (§2 table).
std::vector<std::string> ValidTopologies(Generation gen);

// ---------------------------------------------------------------------------------------------
// Derived numbers (§3)
// ---------------------------------------------------------------------------------------------

// "<canonical>-<chips × cores per chip>", e.g. PodTypeName(kV6e, 16) == "v6e-16".
std::string PodTypeName(Generation gen, int chips);

// §3.2 pod-type inference, a pure function that does not check topology validity for the
// version ("4x4" with "TPU-V5P" gives "v5p-32"). nullopt when the version is unknown or the
// topology is empty ("unknown") or does not parse.
std::optional<std::string> InferPodType(std::string_view version, std::string_view topology);

// §3.3 default chips per host: for v5litepod and v6e with topology 1x1, 2x2 or 2x4 the slice's
// chip count (1, 4, 8); otherwise 4. `topology` is normalised first; validity is not checked.
int DefaultChipsPerHost(Generation gen, std::string_view topology);

// The shape of one slice as requested by a reservation or a cluster query.
struct SliceShape {
  Generation gen = Generation::kV4;
  std::string topology;     // normalised ("4x4")
  int chips = 0;            // C: chips of the whole slice
  int chips_per_host = 0;   // c: §3.3 default, or the caller's chips_per_vm
  int hosts = 0;            // H = max(1, C / c)
  std::string pod_type;     // "v6e-16"
  bool single_host = false; // C <= c
};

// Validates version (§2), topology (§3.1 and membership in the version's set) and chips_per_vm
// (> 0 when given: "chips_per_vm must be positive."), then derives the §3 numbers.
// Does not check that C is divisible by c; ComputeBundleLayout does.
StatusOr<SliceShape> ComputeSliceShape(std::string_view version, std::string_view topology,
                                       std::optional<int> chips_per_vm);

// A pod type read on the node side (§3.5), e.g. from TPU_ACCELERATOR_TYPE.
struct PodType {
  Generation gen = Generation::kV4;
  int size = 0;                    // the N of "<version>-<N>": TensorCores of the whole slice
  int chips = 0;                   // size / cores per chip
  int default_chips_per_host = 0;  // v5litepod/v6e with <= 8 chips: chips; else 4
  std::string normalized;          // "v7x-16" for "tpu7x-16", "v5litepod-8" for "v5e-8"
};

// Accepts `v<digits><letters>-<digits>` after the §2 prefix normalisation ("tpu7x-16" -> v7x-16).
// Errors (InvalidArgument): a known version without size ("v6e", "v2", "v2-") -> "... must include
// size ..."; anything else ("invalid-8", "v-8", "8", "tpu-8", "random-string") -> "Invalid
// accelerator type '<p>'". A size of 0 or one not divisible by the cores per chip is also invalid.
StatusOr<PodType> ParsePodType(std::string_view pod_type);

// §3.6: hosts of the slice a live node belongs to, ceil(size / (node_chips × cores per chip)).
// Authoritative over a TPU_WORKER_HOSTNAMES list. Returns 0 when node_chips <= 0 (no TPU node).
int HostsOfSliceFromNode(int node_chips, const PodType& pod_type);

// ---------------------------------------------------------------------------------------------
// Reservation bundle layout (§6 "Bundle shape and count")
// ---------------------------------------------------------------------------------------------

struct BundleLayout {
  int tpu_per_bundle = 0;     // T
  int bundles_per_slice = 0;  // B = C / T
  int bundles_per_host = 0;   // b = c / T
  int total_bundles = 0;      // N = num_slices × B
};

// Strategy names accepted by ComputeBundleLayout, in the §6 order.
const std::vector<std::string>& ValidStrategies();

// Checks, in this order, each failure being InvalidArgument:
//   T is a positive integer ("TPU per bundle must be positive" / "... must be an integer");
//   num_slices >= 1; strategy is SPREAD, STRICT_SPREAD, PACK or STRICT_PACK;
//   C % T == 0 ("uneven distribution of TPU across bundles is not supported");
//   C % c == 0 and c % T == 0 ("bundle would not fit a host");
//   STRICT_SPREAD needs b == 1; STRICT_PACK needs num_slices == 1 and H == 1.
// `tpu_per_bundle` is the TPU of resources_per_bundle; a request without a TPU key passes
// shape.chips_per_host (or calls the overload below).
StatusOr<BundleLayout> ComputeBundleLayout(const SliceShape& shape, double tpu_per_bundle,
                                           int num_slices, std::string_view strategy);
// Same with T = shape.chips_per_host (one bundle per host).
StatusOr<BundleLayout> ComputeBundleLayout(const SliceShape& shape, int num_slices,
                                           std::string_view strategy);

struct BundleLocation {
  int slice_index = 0;  // ⌊i / B⌋
  int host_index = 0;   // worker id within the slice: ⌊(i mod B) / b⌋
};

// Slice-major numbering. `bundle_index` must be in [0, layout.total_bundles) and `layout` must
// come from ComputeBundleLayout(shape, ...); anything else is a caller bug (asserts).
BundleLocation LocateBundle(const SliceShape& shape, const BundleLayout& layout, int bundle_index);

}  // namespace torus::tpu
