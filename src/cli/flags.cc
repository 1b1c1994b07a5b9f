#include "cli/flags.h"

#include <algorithm>
#include <cstdlib>
#include <iostream>

namespace torus {

namespace {

size_t EditDistance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string ClosestFlag(const std::string& flag, const std::vector<std::string>& known) {
  std::string best;
  size_t best_d = 3;
  for (const auto& k : known) {
    size_t d = EditDistance(flag, k);
    if (d < best_d && d * 3 <= flag.size() + 2) {
      best = k;
      best_d = d;
    }
  }
  return best;
}

std::string UnknownFlagMessage(const std::map<std::string, std::string>& given,
                               const std::vector<std::string>& known) {
  for (const auto& [k, v] : given) {
    if (std::find(known.begin(), known.end(), k) != known.end()) continue;
    std::string msg = "unknown flag --" + k;
    std::string close = ClosestFlag(k, known);
    if (!close.empty()) msg += " (did you mean --" + close + "?)";
    return msg;
  }
  return "";
}

void RequireKnownFlags(const std::string& command, const std::map<std::string, std::string>& given,
                       const std::vector<std::string>& known) {
  std::string msg = UnknownFlagMessage(given, known);
  if (msg.empty()) return;
  std::cerr << "torus " << command << ": " << msg << "\n(see torus " << command << " --help)" << std::endl;
  exit(2);
}

}  // namespace torus
