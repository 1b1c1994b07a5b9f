#include "embedded/head_args.h"

#include <cstdlib>
#include <stdexcept>

#include "torus/api/exceptions.h"
#include "torus/api/json.h"

namespace torus::embedded {

using internal::RayException;

namespace {

double ParseNumber(const std::string& flag, const std::string& v) {
  char* end = nullptr;
  double d = std::strtod(v.c_str(), &end);
  if (v.empty() || *end != '\0' || d < 0) {
    throw RayException("head_args: " + flag + " needs a non-negative number, got '" + v + "'");
  }
  return d;
}

internal::Json::Object ParseObject(const std::string& flag, const std::string& v) {
  try {
    internal::Json j = internal::Json::Parse(v);
    if (j.type() == internal::Json::Type::kObject) return j.as_object();
  } catch (const std::invalid_argument&) {
  }
  throw RayException("head_args: " + flag + " needs a JSON object, got '" + v + "'");
}

void ApplyHeadArg(const std::string& flag, const std::string& v, NodeConfig* node) {
  if (flag == "--num-cpus") {
    node->resources["CPU"] = ParseNumber(flag, v);
  } else if (flag == "--num-gpus") {
    node->resources["GPU"] = ParseNumber(flag, v);
  } else if (flag == "--object-store-memory") {
    node->object_store_bytes = static_cast<uint64_t>(ParseNumber(flag, v));
  } else if (flag == "--object-spilling-directory" || flag == "--spill-dir") {
    node->spill_dir = v;
  } else if (flag == "--resources") {
    for (const auto& [k, j] : ParseObject(flag, v)) {
      if (!j.is_number()) throw RayException("head_args: --resources: '" + k + "' is not a number");
      node->resources[k] = j.as_double();
    }
  } else if (flag == "--labels") {
    for (const auto& [k, j] : ParseObject(flag, v)) {
      if (j.type() != internal::Json::Type::kString) {
        throw RayException("head_args: --labels: '" + k + "' is not a string");
      }
      node->labels[k] = j.as_string();
    }
  } else {
    throw RayException("head_args: " + flag +
                       " is not supported by Torus's embedded cluster (supported: --num-cpus, "
                       "--num-gpus, --resources, --object-store-memory, --object-spilling-directory, --labels)");
  }
}

}  // namespace

void ApplyHeadArgs(const std::vector<std::string>& head_args, NodeConfig* node) {
  for (size_t i = 0; i < head_args.size(); ++i) {
    const std::string& a = head_args[i];
    size_t eq = a.find('=');
    std::string flag = a.substr(0, eq);
    std::string value;
    if (eq != std::string::npos) {
      value = a.substr(eq + 1);
    } else if (i + 1 < head_args.size()) {
      value = head_args[++i];
    } else {
      throw RayException("head_args: " + flag + " needs a value");
    }
    ApplyHeadArg(flag, value, node);
  }
}

}  // namespace torus::embedded
