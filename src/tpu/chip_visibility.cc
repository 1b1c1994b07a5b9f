#include "tpu/chip_visibility.h"

#include <algorithm>
#include <cctype>
#include <sstream>

namespace torus::tpu {

void EnvChanges::ApplyTo(std::map<std::string, std::string>* env) const {
  for (const std::string& name : unset) env->erase(name);
  for (const auto& [name, value] : set) (*env)[name] = value;
}

bool IsTruthy(std::string_view value) {
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.front()))) {
    value.remove_prefix(1);
  }
  while (!value.empty() && std::isspace(static_cast<unsigned char>(value.back()))) {
    value.remove_suffix(1);
  }
  std::string lower(value);
  for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return lower == "1" || lower == "true" || lower == "yes" || lower == "on";
}

bool VisibilityOptOut(const std::map<std::string, std::string>& env) {
  for (std::string_view name : {kEnvNosetVisibleChips, kEnvRayNosetVisibleChips}) {
    auto it = env.find(std::string(name));
    if (it != env.end() && IsTruthy(it->second)) return true;
  }
  return false;
}

EnvChanges ComputeChipVisibility(int node_chips, const std::vector<int>& granted_chip_ids,
                                 bool opt_out) {
  EnvChanges changes;
  std::vector<int> ids = granted_chip_ids;
  std::sort(ids.begin(), ids.end());
  ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
  if (opt_out || ids.empty()) return changes;

  if (static_cast<int>(ids.size()) >= node_chips) {
    changes.unset = {std::string(kEnvChipsPerHostBounds), std::string(kEnvHostBounds)};
    return changes;
  }
  std::string visible;
  for (int id : ids) {
    if (!visible.empty()) visible += ',';
    visible += std::to_string(id);
  }
  changes.set[std::string(kEnvVisibleChips)] = visible;
  if (ids.size() == 1) {
    changes.set[std::string(kEnvChipsPerHostBounds)] = "1,1,1";
    changes.set[std::string(kEnvHostBounds)] = "1,1,1";
  } else if (ids.size() == 2) {
    changes.set[std::string(kEnvChipsPerHostBounds)] = "1,2,1";
    changes.set[std::string(kEnvHostBounds)] = "1,1,1";
  }
  return changes;
}

Status ValidateTaskTpuRequest(double amount) {
  if (amount == 0 || amount == 1 || amount == 2 || amount == 4 || amount == 8) {
    return Status::Ok();
  }
  std::ostringstream got;
  got << amount;
  return InvalidArgument("TPU request must be 1, 2, 4 or 8 (got " + got.str() + ")");
}

}  // namespace torus::tpu
