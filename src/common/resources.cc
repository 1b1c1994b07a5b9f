#include "common/resources.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace torus {

ResourceAmount::ResourceAmount(double whole) {
  if (std::isnan(whole)) return;
  double u = std::round(whole * kUnitsPerWhole);
  if (u >= 0x1p63) {
    units_ = INT64_MAX;
  } else if (u < -0x1p63) {
    units_ = INT64_MIN;
  } else {
    units_ = static_cast<int64_t>(u);
  }
}

ResourceMap ToAmounts(const ResourceDoubles& m) { return ResourceMap(m.begin(), m.end()); }

ResourceDoubles ToDoubles(const ResourceMap& m) {
  ResourceDoubles out;
  for (const auto& [k, v] : m) out.emplace(k, v.ToDouble());
  return out;
}

ResourceMap FromProto(const rpc::ResourceSet& r) {
  ResourceMap m;
  for (const auto& [k, u] : r.units()) m.emplace(k, ResourceAmount::FromUnits(u));
  for (const auto& [k, v] : r.legacy_amounts()) m.emplace(k, ResourceAmount(v));  // units win
  return m;
}

void ToProto(const ResourceMap& m, rpc::ResourceSet* out) {
  out->mutable_legacy_amounts()->clear();
  auto* u = out->mutable_units();
  u->clear();
  for (const auto& [k, v] : m) (*u)[k] = v.units();
}

ResourceAmount AmountIn(const rpc::ResourceSet& r, const std::string& name) {
  if (auto it = r.units().find(name); it != r.units().end()) return ResourceAmount::FromUnits(it->second);
  if (auto it = r.legacy_amounts().find(name); it != r.legacy_amounts().end()) return ResourceAmount(it->second);
  return ResourceAmount();
}

std::string ResourcesToString(const ResourceMap& m) {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (const auto& [k, v] : m) {
    if (!first) os << ", ";
    first = false;
    os << k << ": ";
    int64_t u = v.units();
    uint64_t mag = u < 0 ? 0 - static_cast<uint64_t>(u) : static_cast<uint64_t>(u);
    constexpr uint64_t kPer = ResourceAmount::kUnitsPerWhole;
    if (u < 0) os << "-";
    os << mag / kPer;
    if (uint64_t frac = mag % kPer; frac != 0) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "%04llu", static_cast<unsigned long long>(frac));
      std::string digits(buf);
      while (digits.back() == '0') digits.pop_back();
      os << "." << digits;
    }
  }
  os << "}";
  return os.str();
}

namespace {

std::string Shown(std::string_view where, std::string_view name, double amount) {
  std::ostringstream os;
  os << where << ": " << (name.empty() ? "''" : std::string(name)) << " = " << amount;
  return os.str();
}

Status ValidateOne(std::string_view where, const std::string& name, double amount) {
  if (name.empty()) return InvalidArgument(Shown(where, name, amount) + ": a resource needs a name");
  if (std::isnan(amount)) return InvalidArgument(Shown(where, name, amount) + " is not a number");
  if (std::isinf(amount)) return InvalidArgument(Shown(where, name, amount) + " is infinite");
  if (amount < 0) {
    return InvalidArgument(Shown(where, name, amount) + " is negative; expected a number >= 0");
  }
  if (amount > MaxResourceAmount(name)) {
    std::ostringstream os;
    os << Shown(where, name, amount) << " is too large; expected at most " << MaxResourceAmount(name);
    return InvalidArgument(os.str());
  }
  return Status::Ok();
}

Status RequestShape(std::string_view where, const std::string& name, double amount) {
  if (amount <= 0) {
    return InvalidArgument(Shown(where, name, amount) + ": resource amounts must be positive");
  }
  if (amount * ResourceAmount::kUnitsPerWhole < 0.5) {
    return InvalidArgument(Shown(where, name, amount) +
                           ": the precision of a fractional amount cannot go beyond 0.0001");
  }
  if (amount > 1 && std::floor(amount) != amount) {
    return InvalidArgument(Shown(where, name, amount) +
                           ": resource amounts above 1 must be whole numbers");
  }
  return Status::Ok();
}

}  // namespace

double MaxResourceAmount(std::string_view name) {
  if (name == "memory" || name == "object_store_memory") return std::ldexp(1.0, 49);
  return 1e14;
}

Status ValidateResources(const ResourceDoubles& m, std::string_view where) {
  for (const auto& [name, amount] : m) {
    if (auto s = ValidateOne(where, name, amount); !s.ok()) return s;
  }
  return Status::Ok();
}

Status ValidateResourceRequest(const ResourceDoubles& m, std::string_view where) {
  if (auto s = ValidateResources(m, where); !s.ok()) return s;
  for (const auto& [name, amount] : m) {
    if (auto s = RequestShape(where, name, amount); !s.ok()) return s;
  }
  return Status::Ok();
}

namespace {

// Every amount of a wire set as a double, for the rules above: units are exact multiples of
// 1/10,000, so the double shows what was sent (negative or too large units stay so).
ResourceDoubles WireDoubles(const rpc::ResourceSet& r) {
  ResourceDoubles m;
  for (const auto& [k, u] : r.units()) m.emplace(k, ResourceAmount::FromUnits(u).ToDouble());
  for (const auto& [k, v] : r.legacy_amounts()) m.emplace(k, v);
  return m;
}

}  // namespace

Status ValidateResourceSet(const rpc::ResourceSet& r, std::string_view where) {
  return ValidateResources(WireDoubles(r), where);
}

Status ValidateResourceSetRequest(const rpc::ResourceSet& r, std::string_view where) {
  return ValidateResourceRequest(WireDoubles(r), where);
}

StatusOr<double> ParseResourceAmount(std::string_view name, const std::string& text,
                                     std::string_view where) {
  double v = 0;
  size_t used = 0;
  try {
    v = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  if (used == 0 || used != text.size()) {
    return InvalidArgument(std::string(where) + ": '" + text + "' is not a number");
  }
  if (auto s = ValidateResources({{std::string(name), v}}, where); !s.ok()) return s;
  return v;
}

std::string HumanBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (std::fabs(bytes) >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  int decimals = u == 0 || std::fabs(bytes) >= 100 ? 0 : std::fabs(bytes) >= 10 ? 1 : 2;
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, bytes, kUnits[u]);
  return buf;
}

}  // namespace torus
