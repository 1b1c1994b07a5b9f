// Resource sets ("CPU": 2, "memory": 1e9, "TPU": 4, any custom name) and their arithmetic.
// Amounts are doubles; comparisons allow a small epsilon so fractional requests add up.
#pragma once

#include <map>
#include <string>

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

}  // namespace torus
