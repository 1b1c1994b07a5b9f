// Resource sets ("CPU": 2, "memory": 1e9, "TPU": 4, any custom name), their arithmetic, and the
// one rule for which amounts are valid (ValidateResources), applied wherever amounts enter: CLI
// flags, manifests, task/actor options, placement-group bundles, and the node and head RPCs.
//
// Amounts are exact: a ResourceAmount counts whole units of 1/10,000 (as Ray's FixedPoint does),
// so adding and taking back 0.1 CPU a million times returns to exactly where it started and a
// node's 2 CPUs stay 2 (with doubles they drifted to 1.999999999999911 and a request for 2 never
// fitted again). Doubles appear only at the edges: user input (flags, manifests, the C++ and
// Python APIs, HTTP) is validated as doubles and rounded to the nearest unit once; output for
// people and APIs (status, dashboard, metrics, ray.available_resources()) converts back. The wire
// and the head's durable state carry the units (rpc::ResourceSet.units, docs/wire.md).
// Pure functions and value types, thread-safe.
#pragma once

#include <compare>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "common/status.h"
#include "proto/torus.pb.h"

namespace torus {

// An amount of one resource in units of 1/10,000 (bytes for "memory": 1 byte = 10,000 units).
// Arithmetic saturates at the int64 limits (about +-9.2e14 of the resource) instead of
// overflowing: sums of validated amounts (at most MaxResourceAmount each) stay far below it in
// any real cluster, and a saturated sum still compares as "more than any node has".
class ResourceAmount {
 public:
  static constexpr int64_t kUnitsPerWhole = 10000;

  constexpr ResourceAmount() = default;
  // Rounds to the nearest unit (0.1 -> 1000 units, 1/3 -> 3333). Implicit, so literals read as
  // amounts ({"CPU", 0.5}); callers validate user input first (ValidateResources) — here NaN
  // reads as 0 and values beyond the range saturate.
  ResourceAmount(double whole);  // NOLINT(google-explicit-constructor)
  static constexpr ResourceAmount FromUnits(int64_t units) {
    ResourceAmount a;
    a.units_ = units;
    return a;
  }

  constexpr int64_t units() const { return units_; }
  // For display and API output only; never compute with it and convert back.
  double ToDouble() const { return static_cast<double>(units_) / kUnitsPerWhole; }
  constexpr bool IsWhole() const { return units_ % kUnitsPerWhole == 0; }
  constexpr int64_t Whole() const { return units_ / kUnitsPerWhole; }  // the fraction dropped
  constexpr bool Positive() const { return units_ > 0; }

  ResourceAmount& operator+=(ResourceAmount o) {
    if (__builtin_add_overflow(units_, o.units_, &units_)) units_ = o.units_ > 0 ? INT64_MAX : INT64_MIN;
    return *this;
  }
  ResourceAmount& operator-=(ResourceAmount o) {
    if (__builtin_sub_overflow(units_, o.units_, &units_)) units_ = o.units_ < 0 ? INT64_MAX : INT64_MIN;
    return *this;
  }
  friend ResourceAmount operator+(ResourceAmount a, ResourceAmount b) { return a += b; }
  friend ResourceAmount operator-(ResourceAmount a, ResourceAmount b) { return a -= b; }
  friend constexpr bool operator==(ResourceAmount a, ResourceAmount b) = default;
  friend constexpr auto operator<=>(ResourceAmount a, ResourceAmount b) = default;

 private:
  int64_t units_ = 0;
};

using ResourceMap = std::map<std::string, ResourceAmount>;
// Amounts as the user or an API gives or reads them (validated, then rounded to a ResourceMap).
using ResourceDoubles = std::map<std::string, double>;

// Whether every positive amount of `request` is available (exact comparison).
inline bool Fits(const ResourceMap& request, const ResourceMap& available) {
  for (const auto& [k, v] : request) {
    if (!v.Positive()) continue;
    auto it = available.find(k);
    if (it == available.end() || it->second < v) return false;
  }
  return true;
}
inline void Subtract(ResourceMap& from, const ResourceMap& amount) {
  for (const auto& [k, v] : amount) from[k] -= v;
}
inline void Add(ResourceMap& to, const ResourceMap& amount) {
  for (const auto& [k, v] : amount) to[k] += v;
}

ResourceMap ToAmounts(const ResourceDoubles& m);  // rounds each to the nearest unit
ResourceDoubles ToDoubles(const ResourceMap& m);

// A set from the wire or durable state: `units`, and for a name only in `legacy_amounts` (sets
// written before amounts were fixed point, e.g. a head state file of an older version) that
// double rounded to the nearest unit.
ResourceMap FromProto(const rpc::ResourceSet& r);
// Writes `units` only (and clears both maps).
void ToProto(const ResourceMap& m, rpc::ResourceSet* out);
// One amount of a set as FromProto reads it (zero when absent), without building the map.
ResourceAmount AmountIn(const rpc::ResourceSet& r, const std::string& name);

// "{CPU: 1, TPU: 4, GPU: 0.25}": whole amounts without a fraction, others to 4 decimals at most.
std::string ResourcesToString(const ResourceMap& m);

// Largest amount of one resource: 1e14 (Ray's int64 fixed point holds up to ~9.2e14; num_cpus=1e10
// is valid, merely infeasible), or 2^49 bytes (512 TiB) for the byte-valued resources "memory" and
// "object_store_memory" (2^49 bytes in 1/10,000 units is 5.6e18, inside int64; 2^50 is not).
double MaxResourceAmount(std::string_view name);

// The one rule for a resource set that a node offers or a piece of work asks for: every name is
// non-empty and every amount is a finite number in [0, MaxResourceAmount(name)]. InvalidArgument
// names `where` (a flag, a manifest field, an option), the resource and the amount, e.g.
// "--num-cpus: CPU = -3 is negative; expected a number >= 0".
Status ValidateResources(const ResourceDoubles& m, std::string_view where);

// ValidateResources, plus the shape rules of a request from the user API: every amount is
// positive and at least one unit (Ray: "cannot go beyond 0.0001"), and a whole number when above
// 1 (fractions of one unit can be shared; several units cannot).
Status ValidateResourceRequest(const ResourceDoubles& m, std::string_view where);

// The same two rules for a set received on the wire (both its units and any legacy doubles).
Status ValidateResourceSet(const rpc::ResourceSet& r, std::string_view where);
Status ValidateResourceSetRequest(const rpc::ResourceSet& r, std::string_view where);

// A single amount given as text (a CLI flag): a number, then ValidateResources.
StatusOr<double> ParseResourceAmount(std::string_view name, const std::string& text,
                                     std::string_view where);

// Bytes as "15.8 GiB", "512 MiB", "12 B" (binary units, three significant figures).
std::string HumanBytes(double bytes);

}  // namespace torus
