#include "common/tpu_labels.h"

namespace torus::tpu {

namespace {
constexpr std::string_view kTpuLabelSuffixes[] = {"accelerator-type", "tpu-slice-name",
                                                  "tpu-worker-id", "tpu-topology",
                                                  "tpu-pod-type"};
constexpr std::string_view kRayPrefix = "ray.io/";
constexpr std::string_view kTorusPrefix = "torus.io/";

bool IsTpuSuffix(std::string_view suffix) {
  for (std::string_view s : kTpuLabelSuffixes) {
    if (s == suffix) return true;
  }
  return false;
}
}  // namespace

std::string NormalizeLabelKey(std::string_view key) {
  if (key.substr(0, kRayPrefix.size()) == kRayPrefix &&
      IsTpuSuffix(key.substr(kRayPrefix.size()))) {
    return std::string(kTorusPrefix) + std::string(key.substr(kRayPrefix.size()));
  }
  return std::string(key);
}

bool IsReservedTpuLabelKey(std::string_view key) {
  for (std::string_view prefix : {kRayPrefix, kTorusPrefix}) {
    if (key.substr(0, prefix.size()) == prefix && IsTpuSuffix(key.substr(prefix.size()))) {
      return true;
    }
  }
  return false;
}

StatusOr<std::map<std::string, std::string>> NormalizeSelectorKeys(
    const std::map<std::string, std::string>& selector) {
  std::map<std::string, std::string> out;
  for (const auto& [key, value] : selector) {
    std::string normalized = NormalizeLabelKey(key);
    auto [it, inserted] = out.emplace(normalized, value);
    if (!inserted && it->second != value) {
      return InvalidArgument("label selector gives conflicting values for '" + normalized +
                             "' and its ray.io/ alias: '" + it->second + "' vs '" + value + "'");
    }
  }
  return out;
}

}  // namespace torus::tpu
