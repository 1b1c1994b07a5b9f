// The part of a worker pool key that stands for runtime_env env_vars (docs/architecture.md):
// workers started with different variables are never shared, so a task or actor only ever runs
// in a process whose environment has exactly its variables. Pure functions; thread-safe.
#pragma once

#include <map>
#include <string>

namespace torus {

// "" for no variables, else "|env=" and each name=value in name order, every part
// length-prefixed so that no two different maps give the same key. Map: any map of strings
// (std::map, google::protobuf::Map).
template <class Map>
std::string EnvVarsKey(const Map& env_vars) {
  if (env_vars.empty()) return "";
  std::map<std::string, std::string> sorted(env_vars.begin(), env_vars.end());
  std::string key = "|env=";
  for (const auto& [name, value] : sorted) {
    key += std::to_string(name.size()) + ":" + name + std::to_string(value.size()) + ":" + value;
  }
  return key;
}

// The pool key of workers started as exactly `argv` (Python workers: interpreter and
// bootstrap): "cmd:" and each argument NUL-terminated. The core worker names its leases with it
// and the node keys the workers it starts for actors with it, so both must use this one rule.
template <class Args>
std::string CommandKey(const Args& argv) {
  std::string key = "cmd:";
  for (const auto& a : argv) {
    key += a;
    key += '\0';
  }
  return key;
}

}  // namespace torus
