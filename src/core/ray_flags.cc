#include "core/ray_flags.h"

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <map>
#include <set>

#include "torus/api/exceptions.h"
#include "torus/api/json.h"

namespace torus::core {

namespace {

using internal::RayException;

std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find(sep, start);
    if (end == std::string::npos) end = s.size();
    if (end > start) out.push_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Ray's flags that name something Torus does not have, and why they are ignored.
const std::map<std::string, std::string>& IgnoredFlags() {
  static const auto* m = new std::map<std::string, std::string>{
      {"ray_redis_password", "Torus has no Redis; clients authenticate with the session token"},
      {"ray_job_id", "Torus assigns job ids itself"},
      {"ray_node_ip_address", "set TORUS_BIND_HOST for the address this process listens on"},
      {"ray_node_manager_port", "Torus workers are started by their node, not by flags"},
      {"ray_raylet_socket_name", "Torus workers are started by their node, not by flags"},
      {"ray_plasma_store_socket_name", "Torus workers are started by their node, not by flags"},
      {"ray_session_dir", "Torus finds its session through TORUS_TMPDIR"},
      {"startup_token", "Torus workers are started by their node, not by flags"},
  };
  return *m;
}

ActorLifetime ParseLifetime(const std::string& value) {
  std::string v = value;
  std::transform(v.begin(), v.end(), v.begin(), [](unsigned char c) { return std::tolower(c); });
  if (v == "detached") return ActorLifetime::DETACHED;
  if (v == "non_detached") return ActorLifetime::NON_DETACHED;
  throw RayException("--ray_default_actor_lifetime must be `detached` or `non_detached`, got '" +
                     value + "'");
}

// Applies one honoured flag; false when `name` is not one of them.
bool ApplyFlag(const std::string& name, const std::string& v, RayConfig& config, RayFlags* out) {
  if (name == "ray_address") {
    config.address = v;
  } else if (name == "ray_namespace") {
    config.ray_namespace = v;
  } else if (name == "ray_code_search_path") {
    config.code_search_path = Split(v, ':');
  } else if (name == "ray_default_actor_lifetime") {
    config.default_actor_lifetime = ParseLifetime(v);
  } else if (name == "ray_logs_dir") {
    out->logs_dir = v;
  } else if (name == "ray_head_args") {
    for (auto& a : Split(v, ' ')) config.head_args.push_back(std::move(a));
  } else {
    return false;
  }
  return true;
}

}  // namespace

RayFlags ParseRayFlags(RayConfig& config, int argc, char** argv) {
  static const std::set<std::string> kHonoured = {
      "ray_address",        "ray_namespace", "ray_code_search_path", "ray_default_actor_lifetime",
      "ray_logs_dir",       "ray_head_args"};
  RayFlags out;
  for (int i = 1; i < argc && argv && argv[i]; ++i) {
    std::string a = argv[i];
    size_t dashes = a.rfind("--", 0) == 0 ? 2 : (a.rfind("-", 0) == 0 ? 1 : 0);
    std::string body = a.substr(dashes);
    if (dashes == 0 || (body.rfind("ray_", 0) != 0 && body.rfind("startup_token", 0) != 0)) {
      continue;  // not a Ray flag: the program's own
    }
    size_t eq = body.find('=');
    std::string name = body.substr(0, eq);
    auto ignored = IgnoredFlags().find(name);
    if (!kHonoured.count(name) && ignored == IgnoredFlags().end()) {
      // Not Ray's: a value after it is not taken (it may be the program's own argument).
      out.warnings.push_back("torus: ignoring " + a + ": not a Ray flag Torus knows");
      continue;
    }
    std::string value;
    if (eq != std::string::npos) {
      value = body.substr(eq + 1);
    } else if (i + 1 < argc && argv[i + 1]) {
      value = argv[++i];  // `--flag value`
    } else {
      throw RayException("flag --" + name + " needs a value");
    }
    if (ApplyFlag(name, value, config, &out)) continue;
    out.warnings.push_back("torus: ignoring --" + name + ": " + ignored->second);
  }
  return out;
}

}  // namespace torus::core
