// ray::Task(f): submits a registered free function as a task.
//
//   auto sum = ray::Task(Plus).SetResource("CPU", 1).Remote(1, 2);     // ObjectRef<int>
//   auto next = ray::Task(Plus).Remote(sum, 10);                        // waits for `sum` remotely
//
// Task() throws RayFunctionNotFound when f was not registered with RAY_REMOTE. Remote() checks
// argument count and types at compile time (see arguments.h), validates the options, and
// submits; it requires Init(). A TaskCaller may be reused for several Remote() calls.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>

#include "torus/api/arguments.h"
#include "torus/api/object_ref.h"
#include "torus/api/placement_group.h"
#include "torus/api/remote.h"
#include "torus/api/runtime_env.h"
#include "torus/api/task_options.h"
#include "torus/api/type_traits.h"
#include "torus/internal/runtime.h"

namespace torus {
namespace internal {

template <typename F>
class TaskCaller {
 public:
  TaskCaller() = default;
  explicit TaskCaller(std::string function_name) : function_name_(std::move(function_name)) {}

  template <typename... Args>
  ObjectRef<RemoteReturn<F>> Remote(Args&&... args) const {
    ValidateResources(options_.resources);
    std::vector<TaskArg> task_args = WrapArgs<F>(std::forward<Args>(args)...);
    std::string id = RequireRuntime().SubmitTask(function_name_, std::move(task_args), options_);
    return ObjectRefAccess::Adopt<RemoteReturn<F>>(std::move(id));
  }

  // For listings and logs.
  TaskCaller& SetName(std::string name) {
    options_.name = std::move(name);
    return *this;
  }
  // Replaces all resource demands. Default: {CPU: 1}.
  TaskCaller& SetResources(std::unordered_map<std::string, double> resources) {
    options_.resources = std::move(resources);
    return *this;
  }
  // Sets one resource demand, replacing an earlier amount for the same name.
  TaskCaller& SetResource(std::string name, double value) {
    options_.resources[std::move(name)] = value;
    return *this;
  }
  // Runs the task inside bundle `bundle_index` of `group` (-1: any bundle).
  TaskCaller& SetPlacementGroup(PlacementGroup group, int bundle_index) {
    options_.placement_group_id = group.GetID();
    options_.bundle_index = bundle_index;
    return *this;
  }
  // The task runs in a worker process started with `runtime_env` (workers are not shared
  // between different environments): its env_vars are merged over the job's
  // (RayConfig::runtime_env), as in Ray. Throws RayRuntimeEnvException for fields Torus does
  // not support (everything but env_vars and config).
  TaskCaller& SetRuntimeEnv(const RuntimeEnv& runtime_env) {
    CheckSupportedRuntimeEnv(runtime_env);
    options_.serialized_runtime_env = runtime_env.Serialize();
    return *this;
  }
  // Torus extension: retries after the worker running the task dies (-1: no limit). Default 3.
  TaskCaller& SetMaxRetries(int max_retries) {
    ValidateRetryCount("SetMaxRetries", max_retries);
    options_.max_retries = max_retries;
    return *this;
  }
  // Torus extension: only nodes whose labels match every term may run the task.
  TaskCaller& SetLabelSelector(std::unordered_map<std::string, std::string> label_selector) {
    options_.label_selector = std::move(label_selector);
    return *this;
  }

 private:
  std::string function_name_;
  TaskOptions options_;
};

}  // namespace internal

// A caller for the registered free function `func` (a function pointer or RAY_FUNC(...)).
template <typename F>
internal::TaskCaller<F> Task(F func) {
  static_assert(!std::is_member_function_pointer_v<F>,
                "ray::Task takes a free function; call actor methods with handle.Task(&C::m)");
  static_assert(internal::is_function_pointer_v<F>,
                "ray::Task takes a function registered with RAY_REMOTE (lambdas and other "
                "callables cannot run remotely)");
  static_assert(!internal::is_factory_v<F>,
                "ray::Task: this function returns a class pointer, so it is an actor factory; "
                "use ray::Actor(f).Remote(...)");
  return internal::TaskCaller<F>(internal::RemoteNameOf(func));
}

}  // namespace torus
