#include "tpu/topology.h"

#include <algorithm>
#include <cassert>
#include <cctype>
#include <climits>
#include <cmath>

#include "common/text.h"

namespace torus::tpu {
namespace {

bool AllDigits(std::string_view s) {
  return !s.empty() && std::all_of(s.begin(), s.end(),
                                   [](char ch) { return ch >= '0' && ch <= '9'; });
}

// Parses a non-empty run of decimal digits into an int; nullopt on overflow or non-digits.
std::optional<int> ParseDecimal(std::string_view s) {
  if (!AllDigits(s)) return std::nullopt;
  long long value = 0;
  for (char ch : s) {
    value = value * 10 + (ch - '0');
    if (value > INT_MAX) return std::nullopt;
  }
  return static_cast<int>(value);
}

// §2 rule 1: trim, lowercase, and turn a leading "tpu", "tpu-", "tpuv" or "tpu-v" into "v".
std::string NormalizePrefix(std::string_view raw) {
  std::string s = Lower(Trim(raw));
  if (s.rfind("tpu", 0) == 0) {
    size_t pos = 3;
    if (pos < s.size() && s[pos] == '-') ++pos;
    if (pos < s.size() && s[pos] == 'v') ++pos;
    s.replace(0, pos, "v");
  }
  return s;
}

// Resolves an already prefix-normalised version without size suffix ("v5e" -> v5litepod).
std::optional<Generation> LookupCanonical(std::string_view v) {
  if (v == "v5e") return Generation::kV5litepod;
  for (Generation gen : AllGenerations()) {
    if (v == CanonicalName(gen)) return gen;
  }
  return std::nullopt;
}

// Splits "<base>-<digits>" into base and size; returns false when there is no such suffix.
bool SplitSizeSuffix(std::string_view s, std::string_view* base, std::string_view* size) {
  size_t dash = s.rfind('-');
  if (dash == std::string_view::npos) return false;
  std::string_view tail = s.substr(dash + 1);
  if (!AllDigits(tail)) return false;
  *base = s.substr(0, dash);
  *size = tail;
  return true;
}

const char kValidVersionsText[] = "v2, v3, v4, v5p, v5litepod (v5e), v6e, v7x";

void AppendIfNew(std::vector<std::string>* out, const std::string& t) {
  if (std::find(out->begin(), out->end(), t) == out->end()) out->push_back(t);
}

// The 3D sets: a fixed prefix plus every AxBxC with A, B from `ab` and C from `c`.
std::vector<std::string> Grid3D(const std::vector<int>& ab, const std::vector<int>& c) {
  std::vector<std::string> out = {"2x2x1", "2x2x2", "2x2x4", "2x4x4"};
  for (int a : ab) {
    for (int b : ab) {
      for (int cc : c) {
        AppendIfNew(&out, std::to_string(a) + "x" + std::to_string(b) + "x" + std::to_string(cc));
      }
    }
  }
  return out;
}

bool IsSmallLiteTopology(const std::string& t) { return t == "1x1" || t == "2x2" || t == "2x4"; }

bool IsLite(Generation gen) { return gen == Generation::kV5litepod || gen == Generation::kV6e; }

std::string FormatNumber(double v) {
  if (std::isfinite(v) && v == std::floor(v) && std::fabs(v) < 1e15) {
    return std::to_string(static_cast<long long>(v));
  }
  return std::to_string(v);
}

}  // namespace

const std::vector<Generation>& AllGenerations() {
  static const std::vector<Generation> kAll = {Generation::kV2,        Generation::kV3,
                                               Generation::kV4,        Generation::kV5p,
                                               Generation::kV5litepod, Generation::kV6e,
                                               Generation::kV7x};
  return kAll;
}

StatusOr<Generation> NormalizeVersion(std::string_view version) {
  std::string s = NormalizePrefix(version);
  std::string_view base = s;
  std::string_view size;
  SplitSizeSuffix(s, &base, &size);  // §2 rule 2: a size suffix is ignored
  if (std::optional<Generation> gen = LookupCanonical(base)) return *gen;
  return InvalidArgument("Invalid accelerator_type '" + std::string(version) +
                         "'; valid versions: " + kValidVersionsText);
}

std::string CanonicalName(Generation gen) {
  switch (gen) {
    case Generation::kV2: return "v2";
    case Generation::kV3: return "v3";
    case Generation::kV4: return "v4";
    case Generation::kV5p: return "v5p";
    case Generation::kV5litepod: return "v5litepod";
    case Generation::kV6e: return "v6e";
    case Generation::kV7x: return "v7x";
  }
  return "unknown";
}

std::string AcceleratorTypeValue(Generation gen) {
  std::string name = CanonicalName(gen);
  for (char& ch : name) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  return "TPU-" + name;
}

int CoresPerChip(Generation gen) { return IsLite(gen) ? 1 : 2; }

bool Is3D(Generation gen) {
  return gen == Generation::kV4 || gen == Generation::kV5p || gen == Generation::kV7x;
}

std::vector<std::string> GkeAcceleratorValues(Generation gen) {
  switch (gen) {
    case Generation::kV2:
    case Generation::kV3: return {};
    case Generation::kV4: return {"tpu-v4-podslice"};
    case Generation::kV5p: return {"tpu-v5p-slice"};
    case Generation::kV5litepod: return {"tpu-v5-lite-podslice", "tpu-v5-lite-device"};
    case Generation::kV6e: return {"tpu-v6e-slice"};
    case Generation::kV7x: return {"tpu7x"};
  }
  return {};
}

std::optional<Generation> GenerationFromGkeAccelerator(std::string_view gke_value) {
  for (Generation gen : AllGenerations()) {
    for (const std::string& v : GkeAcceleratorValues(gen)) {
      if (v == gke_value) return gen;
    }
  }
  return std::nullopt;
}

std::string NormalizeTopology(std::string_view topology) { return Lower(Trim(topology)); }

StatusOr<std::vector<int>> ParseTopology(std::string_view topology) {
  const std::string t = NormalizeTopology(topology);
  auto invalid = [&](std::string_view why) {
    return InvalidArgument("Invalid topology '" + std::string(topology) + "': " +
                           std::string(why));
  };
  if (t.empty()) return invalid("empty");
  std::vector<int> dims;
  size_t start = 0;
  while (true) {
    size_t x = t.find('x', start);
    std::string_view part = std::string_view(t).substr(
        start, x == std::string::npos ? std::string::npos : x - start);
    std::optional<int> n = ParseDecimal(part);
    if (!n || *n <= 0) return invalid("each dimension must be a positive integer");
    dims.push_back(*n);
    if (x == std::string::npos) break;
    start = x + 1;
  }
  if (dims.size() != 2 && dims.size() != 3) return invalid("expected AxB or AxBxC");
  long long product = 1;
  for (int d : dims) {
    product *= d;
    if (product > INT_MAX) return invalid("too many chips");
  }
  return dims;
}

StatusOr<int> TopologyChips(std::string_view topology) {
  StatusOr<std::vector<int>> dims = ParseTopology(topology);
  if (!dims.ok()) return dims.status();
  int chips = 1;
  for (int d : *dims) chips *= d;  // ParseTopology bounded the product
  return chips;
}

std::vector<std::string> ValidTopologies(Generation gen) {
  static const std::vector<std::string> kV2Set = {"4x4", "4x8", "8x8", "8x16", "16x16"};
  static const std::vector<std::string> kLiteSet = {"1x1", "2x2", "2x4",  "2x8", "4x4",
                                                    "4x8", "8x8", "8x16", "16x16"};
  switch (gen) {
    case Generation::kV2: return kV2Set;
    case Generation::kV3: {
      std::vector<std::string> out = kV2Set;
      out.push_back("16x32");
      out.push_back("32x32");
      return out;
    }
    case Generation::kV4: return Grid3D({4, 8, 12}, {4, 8, 12, 16});
    case Generation::kV5p: return Grid3D({4, 8, 12, 16}, {4, 8, 12, 16, 20, 24});
    case Generation::kV5litepod:
    case Generation::kV6e: return kLiteSet;
    case Generation::kV7x:
      return {"2x2x1", "2x2x2", "2x2x4", "2x4x4",  "4x4x4",
              "4x4x8", "4x8x8", "8x8x8", "8x8x16", "8x16x16"};
  }
  return {};
}

Status ValidateTopology(Generation gen, std::string_view topology) {
  StatusOr<std::vector<int>> dims = ParseTopology(topology);
  if (!dims.ok()) return dims.status();
  const std::string t = NormalizeTopology(topology);
  const std::vector<std::string> valid = ValidTopologies(gen);
  if (std::find(valid.begin(), valid.end(), t) != valid.end()) return Status::Ok();
  std::string list;
  for (const std::string& v : valid) {
    if (!list.empty()) list += ", ";
    list += v;
  }
  return InvalidArgument("Invalid accelerator topology: '" + std::string(topology) +
                         "' for accelerator version: '" + CanonicalName(gen) +
                         "'; valid topologies: " + list);
}

std::string PodTypeName(Generation gen, int chips) {
  const long long cores = static_cast<long long>(chips) * CoresPerChip(gen);
  return CanonicalName(gen) + "-" + std::to_string(cores);
}

std::optional<std::string> InferPodType(std::string_view version, std::string_view topology) {
  StatusOr<Generation> gen = NormalizeVersion(version);
  if (!gen.ok() || Trim(topology).empty()) return std::nullopt;
  StatusOr<int> chips = TopologyChips(topology);
  if (!chips.ok()) return std::nullopt;
  return PodTypeName(*gen, *chips);
}

int DefaultChipsPerHost(Generation gen, std::string_view topology) {
  const std::string t = NormalizeTopology(topology);
  if (IsLite(gen) && IsSmallLiteTopology(t)) {
    StatusOr<int> chips = TopologyChips(t);
    if (chips.ok()) return *chips;
  }
  return 4;
}

StatusOr<SliceShape> ComputeSliceShape(std::string_view version, std::string_view topology,
                                       std::optional<int> chips_per_vm) {
  StatusOr<Generation> gen = NormalizeVersion(version);
  if (!gen.ok()) return gen.status();
  Status valid = ValidateTopology(*gen, topology);
  if (!valid.ok()) return valid;
  if (chips_per_vm.has_value() && *chips_per_vm <= 0) {
    return InvalidArgument("chips_per_vm must be positive.");
  }
  SliceShape shape;
  shape.gen = *gen;
  shape.topology = NormalizeTopology(topology);
  shape.chips = *TopologyChips(shape.topology);
  shape.chips_per_host = chips_per_vm.value_or(DefaultChipsPerHost(*gen, shape.topology));
  shape.hosts = std::max(1, shape.chips / shape.chips_per_host);
  shape.pod_type = PodTypeName(*gen, shape.chips);
  shape.single_host = shape.chips <= shape.chips_per_host;
  return shape;
}

StatusOr<PodType> ParsePodType(std::string_view pod_type) {
  const std::string s = NormalizePrefix(pod_type);
  auto invalid_type = [&]() {
    return InvalidArgument("Invalid accelerator type '" + std::string(pod_type) +
                           "'; expected '<version>-<size>' with version one of " +
                           kValidVersionsText);
  };
  std::string_view base;
  std::string_view size_text;
  if (!SplitSizeSuffix(s, &base, &size_text)) {
    // No "-<digits>": a bare known version ("v6e", or "v2-" with an empty size) lacks its size.
    std::string_view bare = s;
    if (!bare.empty() && bare.back() == '-') bare.remove_suffix(1);
    if (LookupCanonical(bare)) {
      return InvalidArgument("Invalid pod type '" + std::string(pod_type) +
                             "': must include size (e.g. '" + std::string(bare) + "-8')");
    }
    return invalid_type();
  }
  // The base must have the form v<digits><letters> and name a known version.
  std::optional<Generation> gen = LookupCanonical(base);
  if (!gen) return invalid_type();
  std::optional<int> size = ParseDecimal(size_text);
  if (!size || *size <= 0 || *size % CoresPerChip(*gen) != 0) {
    return InvalidArgument("Invalid accelerator type '" + std::string(pod_type) + "': size '" +
                           std::string(size_text) + "' must be a positive multiple of " +
                           std::to_string(CoresPerChip(*gen)) + " cores per chip");
  }
  PodType out;
  out.gen = *gen;
  out.size = *size;
  out.chips = *size / CoresPerChip(*gen);
  out.default_chips_per_host = (IsLite(*gen) && out.chips <= 8) ? out.chips : 4;
  out.normalized = CanonicalName(*gen) + "-" + std::to_string(*size);
  return out;
}

int HostsOfSliceFromNode(int node_chips, const PodType& pod_type) {
  if (node_chips <= 0) return 0;
  const long long cores_per_host = static_cast<long long>(node_chips) * CoresPerChip(pod_type.gen);
  return static_cast<int>((pod_type.size + cores_per_host - 1) / cores_per_host);
}

const std::vector<std::string>& ValidStrategies() {
  static const std::vector<std::string> kStrategies = {"SPREAD", "STRICT_SPREAD", "PACK",
                                                       "STRICT_PACK"};
  return kStrategies;
}

StatusOr<BundleLayout> ComputeBundleLayout(const SliceShape& shape, double tpu_per_bundle,
                                           int num_slices, std::string_view strategy) {
  if (!(tpu_per_bundle > 0)) {  // also rejects NaN
    return InvalidArgument("TPU per bundle must be positive, got " + FormatNumber(tpu_per_bundle));
  }
  if (tpu_per_bundle != std::floor(tpu_per_bundle) || tpu_per_bundle > INT_MAX) {
    return InvalidArgument("TPU per bundle must be an integer number of chips, got " +
                           FormatNumber(tpu_per_bundle));
  }
  if (num_slices < 1) {
    return InvalidArgument("num_slices must be at least 1, got " + std::to_string(num_slices));
  }
  const std::vector<std::string>& strategies = ValidStrategies();
  if (std::find(strategies.begin(), strategies.end(), strategy) == strategies.end()) {
    return InvalidArgument("Invalid strategy '" + std::string(strategy) +
                           "'; valid strategies: SPREAD, STRICT_SPREAD, PACK, STRICT_PACK");
  }
  assert(shape.chips > 0 && shape.chips_per_host > 0);  // from ComputeSliceShape
  const int t = static_cast<int>(tpu_per_bundle);
  const int chips = shape.chips;
  const int per_host = shape.chips_per_host;
  if (chips % t != 0) {
    return InvalidArgument("uneven distribution of TPU across bundles is not supported: " +
                           std::to_string(chips) + " chips per slice (" + shape.topology +
                           ") are not divisible by " + std::to_string(t) + " TPU per bundle");
  }
  if (chips % per_host != 0) {
    return InvalidArgument("bundle would not fit a host: " + std::to_string(chips) +
                           " chips per slice are not divisible by " + std::to_string(per_host) +
                           " chips per host");
  }
  if (per_host % t != 0) {
    return InvalidArgument("bundle would not fit a host: " + std::to_string(per_host) +
                           " chips per host are not divisible by " + std::to_string(t) +
                           " TPU per bundle");
  }
  BundleLayout layout;
  layout.tpu_per_bundle = t;
  layout.bundles_per_slice = chips / t;
  layout.bundles_per_host = per_host / t;
  if (static_cast<long long>(num_slices) * layout.bundles_per_slice > INT_MAX) {
    return InvalidArgument("num_slices " + std::to_string(num_slices) + " is too large");
  }
  layout.total_bundles = num_slices * layout.bundles_per_slice;
  if (strategy == "STRICT_SPREAD" && layout.bundles_per_host != 1) {
    return InvalidArgument("strategy STRICT_SPREAD requires one bundle per host, but " +
                           std::to_string(t) + " TPU per bundle gives " +
                           std::to_string(layout.bundles_per_host) + " bundles per host");
  }
  if (strategy == "STRICT_PACK" && (num_slices != 1 || shape.hosts != 1)) {
    return InvalidArgument("strategy STRICT_PACK requires num_slices = 1 and a single-host "
                           "slice, got num_slices = " + std::to_string(num_slices) + " and " +
                           std::to_string(shape.hosts) + " hosts per slice");
  }
  return layout;
}

StatusOr<BundleLayout> ComputeBundleLayout(const SliceShape& shape, int num_slices,
                                           std::string_view strategy) {
  return ComputeBundleLayout(shape, static_cast<double>(shape.chips_per_host), num_slices,
                             strategy);
}

BundleLocation LocateBundle(const SliceShape& shape, const BundleLayout& layout,
                            int bundle_index) {
  (void)shape;
  assert(layout.bundles_per_slice > 0 && layout.bundles_per_host > 0);
  assert(bundle_index >= 0 && bundle_index < layout.total_bundles);
  assert(layout.bundles_per_slice / layout.bundles_per_host == shape.hosts);
  BundleLocation loc;
  loc.slice_index = bundle_index / layout.bundles_per_slice;
  loc.host_index = (bundle_index % layout.bundles_per_slice) / layout.bundles_per_host;
  return loc;
}

}  // namespace torus::tpu
