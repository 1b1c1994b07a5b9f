// RuntimeEnv: named fields (pip, env_vars, working_dir, ...) holding JSON values, as Ray's C++
// RuntimeEnv.
//
//   ray::RuntimeEnv env;
//   env.Set("env_vars", std::map<std::string, std::string>{{"KEY", "value"}});
//   ray::Task(f).SetRuntimeEnv(env).Remote();   // also ActorCreator, RayConfig::runtime_env
//
// What the runtime applies: `env_vars` (an object of strings), set in the environment of the
// worker processes that run the task or actor; the job's (RayConfig::runtime_env) applies to
// all its tasks and actors, and a task's or actor's own env_vars are merged over the job's, as
// in Ray. `config` is accepted (there is nothing to set up). Any other field (pip, conda,
// working_dir, ...) is refused with RayRuntimeEnvException when the env is given to a task,
// an actor or Init, rather than silently ignored.
//
// Set/Get take bool, numbers, strings, vectors/maps of them, and (as in Ray) nlohmann::json
// and types with nlohmann::json converters (to_json / from_json) when nlohmann/json is
// installed. Errors throw internal::RayRuntimeEnvException. Not thread-safe; a value type.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <utility>

#include "torus/api/exceptions.h"
#include "torus/api/json.h"

namespace torus {

class RuntimeEnv {
 public:
  // Stores `value` as field `name`, replacing an earlier value.
  template <typename T>
  void Set(const std::string& name, const T& value) {
    fields_[name] = internal::ToJson(value);
  }

  // The field converted to T. Throws when absent or of another type.
  template <typename T>
  T Get(const std::string& name) const {
    const internal::Json& field = Field(name);
    try {
      return internal::FromJson<T>(field);
    } catch (const std::invalid_argument& e) {
      throw internal::RayRuntimeEnvException("Failed to get the field " + name + ": " +
                                             e.what());
    }
  }

  // Stores a field given as JSON text; throws when the text is not valid JSON.
  void SetJsonStr(const std::string& name, const std::string& json_str) {
    try {
      fields_[name] = internal::Json::Parse(json_str);
    } catch (const std::invalid_argument& e) {
      throw internal::RayRuntimeEnvException("Failed to set the field " + name + ": " +
                                             e.what());
    }
  }

  // The field as compact JSON text; throws when absent.
  std::string GetJsonStr(const std::string& name) const { return Field(name).Dump(); }

  bool Contains(const std::string& name) const { return fields_.count(name) > 0; }

  // Returns whether a field was removed.
  bool Remove(const std::string& name) { return fields_.erase(name) > 0; }

  bool Empty() const { return fields_.empty(); }

  // All fields as one JSON object, e.g. {"env_vars":{"KEY":"value"}}.
  std::string Serialize() const { return internal::Json(fields_).Dump(); }

  // The form Ray passes to its core: {"serialized_runtime_env":"<Serialize() as a string>"}.
  std::string SerializeToRuntimeEnvInfo() const {
    internal::Json::Object info;
    info["serialized_runtime_env"] = internal::Json(Serialize());
    return internal::Json(std::move(info)).Dump();
  }

  // Inverse of Serialize(); throws when the text is not a JSON object.
  static RuntimeEnv Deserialize(const std::string& serialized_runtime_env) {
    internal::Json json;
    try {
      json = internal::Json::Parse(serialized_runtime_env);
    } catch (const std::invalid_argument& e) {
      throw internal::RayRuntimeEnvException(std::string("Failed to deserialize RuntimeEnv: ") +
                                             e.what());
    }
    if (json.type() != internal::Json::Type::kObject) {
      throw internal::RayRuntimeEnvException(
          "Failed to deserialize RuntimeEnv: expected a JSON object");
    }
    RuntimeEnv env;
    env.fields_ = json.as_object();
    return env;
  }

 private:
  const internal::Json& Field(const std::string& name) const {
    auto it = fields_.find(name);
    if (it == fields_.end()) {
      throw internal::RayRuntimeEnvException("The field " + name + " not found.");
    }
    return it->second;
  }

  internal::Json::Object fields_;
};

namespace internal {

// The env_vars of a serialized RuntimeEnv (RuntimeEnv::Serialize(); "" = none). Throws
// RayRuntimeEnvException naming the field when the env holds a field Torus does not apply
// (see above) or env_vars is not an object of strings.
inline std::map<std::string, std::string> EnvVarsOfSerialized(const std::string& serialized) {
  std::map<std::string, std::string> out;
  if (serialized.empty()) return out;
  Json json;
  try {
    json = Json::Parse(serialized);
  } catch (const std::invalid_argument& e) {
    throw RayRuntimeEnvException(std::string("malformed runtime_env: ") + e.what());
  }
  if (json.type() != Json::Type::kObject) {
    throw RayRuntimeEnvException("malformed runtime_env: expected a JSON object");
  }
  for (const auto& [field, value] : json.as_object()) {
    if (field == "config") continue;
    if (field != "env_vars") {
      throw RayRuntimeEnvException("runtime_env field '" + field +
                                   "' is not supported by Torus (only env_vars is applied)");
    }
    if (value.type() != Json::Type::kObject) {
      throw RayRuntimeEnvException("runtime_env env_vars must be an object of strings");
    }
    for (const auto& [name, v] : value.as_object()) {
      if (v.type() != Json::Type::kString || name.empty() ||
          name.find('=') != std::string::npos) {
        throw RayRuntimeEnvException("runtime_env env_vars: '" + name +
                                     "' must be a non-empty name without '=' with a string value");
      }
      out[name] = v.as_string();
    }
  }
  return out;
}

// Throws as EnvVarsOfSerialized unless the runtime can apply `env`.
inline void CheckSupportedRuntimeEnv(const RuntimeEnv& env) {
  (void)EnvVarsOfSerialized(env.Serialize());
}

}  // namespace internal
}  // namespace torus
