// Resource sets ("CPU": 2, "memory": 1e9, "TPU": 4, any custom name), their arithmetic, and the
// one rule for which amounts are valid (ValidateResources), applied wherever amounts enter: CLI
// flags, manifests, task/actor options, placement-group bundles, and the node and head RPCs.
// Amounts are doubles; comparisons allow a small epsilon so fractional requests add up.
// Pure functions, thread-safe.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "common/status.h"
#include "proto/torus.pb.h"

namespace torus {

using ResourceMap = std::map<std::string, double>;

inline constexpr double kResourceEps = 1e-9;

inline bool Fits(const ResourceMap& request, const ResourceMap& available) {
  for (const auto& [k, v] : request) {
    if (v <= 0) continue;
    auto it = available.find(k);
    double have = it == available.end() ? 0 : it->second;
    if (have + kResourceEps < v) return false;
  }
  return true;
}
inline void Subtract(ResourceMap& from, const ResourceMap& amount) {
  for (const auto& [k, v] : amount) from[k] -= v;
}
inline void Add(ResourceMap& to, const ResourceMap& amount) {
  for (const auto& [k, v] : amount) to[k] += v;
}
inline ResourceMap FromProto(const rpc::ResourceSet& r) {
  return ResourceMap(r.amounts().begin(), r.amounts().end());
}
inline void ToProto(const ResourceMap& m, rpc::ResourceSet* out) {
  auto* a = out->mutable_amounts();
  a->clear();
  for (const auto& [k, v] : m) (*a)[k] = v;
}
// "{CPU: 1, TPU: 4}"
std::string ResourcesToString(const ResourceMap& m);

// Largest amount of one resource: 1e9 units, or 2^50 bytes (1 PiB) for the byte-valued
// resources "memory" and "object_store_memory".
double MaxResourceAmount(std::string_view name);

// The one rule for a resource set that a node offers or a piece of work asks for: every name is
// non-empty and every amount is a finite number in [0, MaxResourceAmount(name)]. InvalidArgument
// names `where` (a flag, a manifest field, an option), the resource and the amount, e.g.
// "--num-cpus: CPU = -3 is negative; expected a number >= 0".
Status ValidateResources(const ResourceMap& m, std::string_view where);

// ValidateResources, plus the shape rules of a request from the user API: every amount is
// positive, and a whole number when above 1 (fractions of one unit can be shared; several
// units cannot).
Status ValidateResourceRequest(const ResourceMap& m, std::string_view where);

// A single amount given as text (a CLI flag): a number, then ValidateResources.
StatusOr<double> ParseResourceAmount(std::string_view name, const std::string& text,
                                     std::string_view where);

// Bytes as "15.8 GiB", "512 MiB", "12 B" (binary units, three significant figures).
std::string HumanBytes(double bytes);

}  // namespace torus
