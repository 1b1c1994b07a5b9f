// FunctionRegistry: the process-wide table RAY_REMOTE fills during static initialisation and
// workers read when running tasks.
//
// Entries are never removed, and they live in node-based maps, so the pointers and references
// handed out (NameOf, Find*) stay valid for the life of the process. A shared mutex guards the
// maps: registration (rare, mostly before main) takes it exclusively, lookups share it.
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "torus/api/exceptions.h"
#include "torus/internal/runtime.h"

namespace torus::internal {

struct FunctionRegistry::Impl {
  // Registers `name` for `key` in `names_by_key`, and `invoker` under `name` in `invokers`.
  // Registering the same key under the same name again is a no-op (RAY_REMOTE in a header runs
  // once per translation unit). Any other clash throws RayException.
  template <typename Invoker>
  void Register(const char* kind, std::string key, std::string name, Invoker invoker,
                std::unordered_map<std::string, Invoker>& invokers) {
    if (name.empty()) throw RayException(std::string("RAY_REMOTE: empty ") + kind + " name");
    std::unique_lock lock(mu);
    auto by_key = names_by_key.find(key);
    if (by_key != names_by_key.end()) {
      if (by_key->second == name) return;
      throw RayException(std::string("RAY_REMOTE: the same ") + kind + " is registered as '" +
                         by_key->second + "' and as '" + name + "'; register it once");
    }
    auto by_name = keys_by_name.find(name);
    if (by_name != keys_by_name.end()) {
      throw RayException("RAY_REMOTE: two different functions are registered as '" + name +
                         "'; remote names must be unique in the program");
    }
    keys_by_name.emplace(name, key);
    invokers.emplace(name, std::move(invoker));
    names_by_key.emplace(std::move(key), std::move(name));
  }

  template <typename Invoker>
  const Invoker* Find(const std::string& name,
                      const std::unordered_map<std::string, Invoker>& invokers) const {
    std::shared_lock lock(mu);
    auto it = invokers.find(name);
    return it == invokers.end() ? nullptr : &it->second;
  }

  mutable std::shared_mutex mu;
  // Guarded by mu. One namespace of names across functions, factories and methods, so a wire
  // name alone tells which entity it is.
  std::unordered_map<std::string, std::string> names_by_key;
  std::unordered_map<std::string, std::string> keys_by_name;
  std::unordered_map<std::string, FunctionInvoker> functions;
  std::unordered_map<std::string, FactoryInvoker> factories;
  std::unordered_map<std::string, MethodInvoker> methods;
};

FunctionRegistry& FunctionRegistry::Instance() {
  static FunctionRegistry registry;
  return registry;
}

FunctionRegistry::Impl& FunctionRegistry::impl() const {
  // Deliberately never destroyed: worker threads may still run invokers while static
  // destructors run at exit.
  static Impl* const impl = new Impl;
  return *impl;
}

void FunctionRegistry::RegisterFunction(std::string key, std::string name,
                                        FunctionInvoker invoker) {
  Impl& state = impl();
  state.Register("function", std::move(key), std::move(name), std::move(invoker),
                 state.functions);
}

void FunctionRegistry::RegisterFactory(std::string key, std::string name,
                                       FactoryInvoker invoker) {
  Impl& state = impl();
  state.Register("actor factory", std::move(key), std::move(name), std::move(invoker),
                 state.factories);
}

void FunctionRegistry::RegisterMethod(std::string key, std::string name, MethodInvoker invoker) {
  Impl& state = impl();
  state.Register("actor method", std::move(key), std::move(name), std::move(invoker),
                 state.methods);
}

const std::string& FunctionRegistry::NameOf(const std::string& key) const {
  const Impl& state = impl();
  std::shared_lock lock(state.mu);
  auto it = state.names_by_key.find(key);
  if (it == state.names_by_key.end()) {
    const bool is_method = !key.empty() && key[0] == 'm';
    throw RayFunctionNotFound(
        std::string(is_method ? "actor method" : "function") +
        " is not registered for remote use: add RAY_REMOTE(" +
        (is_method ? "&Class::Method" : "FunctionName") +
        ") at namespace scope in a source file linked into both the driver and the workers "
        "(overloads: RAY_REMOTE(RAY_FUNC(FunctionName, ArgTypes...)))");
  }
  return it->second;
}

const FunctionInvoker* FunctionRegistry::FindFunction(const std::string& name) const {
  const Impl& state = impl();
  return state.Find(name, state.functions);
}

const FactoryInvoker* FunctionRegistry::FindFactory(const std::string& name) const {
  const Impl& state = impl();
  return state.Find(name, state.factories);
}

const MethodInvoker* FunctionRegistry::FindMethod(const std::string& name) const {
  const Impl& state = impl();
  return state.Find(name, state.methods);
}

}  // namespace torus::internal
