#include "common/resources.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace torus {

std::string ResourcesToString(const ResourceMap& m) {
  std::ostringstream os;
  os << "{";
  bool first = true;
  for (const auto& [k, v] : m) {
    if (!first) os << ", ";
    first = false;
    os << k << ": ";
    if (std::fabs(v - std::round(v)) < 1e-9) {
      os << static_cast<long long>(std::llround(v));
    } else {
      os << v;
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

}  // namespace

double MaxResourceAmount(std::string_view name) {
  if (name == "memory" || name == "object_store_memory") return std::ldexp(1.0, 50);
  return 1e9;
}

Status ValidateResources(const ResourceMap& m, std::string_view where) {
  for (const auto& [name, amount] : m) {
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
  }
  return Status::Ok();
}

Status ValidateResourceRequest(const ResourceMap& m, std::string_view where) {
  if (auto s = ValidateResources(m, where); !s.ok()) return s;
  for (const auto& [name, amount] : m) {
    if (amount <= 0) {
      return InvalidArgument(Shown(where, name, amount) + ": resource amounts must be positive");
    }
    if (amount > 1 && std::floor(amount) != amount) {
      return InvalidArgument(Shown(where, name, amount) +
                             ": resource amounts above 1 must be whole numbers");
    }
  }
  return Status::Ok();
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
