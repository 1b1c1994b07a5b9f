#include "common/resources.h"

#include <cmath>
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

}  // namespace torus
