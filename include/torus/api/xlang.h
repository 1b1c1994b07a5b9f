// Cross-language calls from C++ into Python, with Ray's C++ API names:
//
//   auto r = ray::Task(ray::PyFunction<int>{"my_module", "add"}).Remote(1, 2);   // ObjectRef<int>
//   ray::ActorHandleXlang a = ray::Actor(ray::PyActorClass{"my_module", "Counter"}).Remote(10);
//   auto n = a.Task(ray::PyActorMethod<int>{"add"}).Remote(5);
//
// The Python function or class is imported by name (module, then the name inside it) in a
// Python worker, which needs `torus` installed in the interpreter the cluster starts for Python
// work (TORUS_PYTHON_WORKER_COMMAND, default `python3 -m torus._private.worker_main`).
// Arguments and results cross as msgpack, as in Ray: numbers, strings, binary, lists, maps
// and ObjectRefs; R must be unpackable from what the Python code returns.
#pragma once

#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torus/api/object_ref.h"
#include "torus/api/serializer.h"
#include "torus/api/task_options.h"
#include "torus/internal/runtime.h"

namespace torus {

template <typename R = void>
struct PyFunction {
  std::string module_name;
  std::string function_name;
};

struct PyActorClass {
  std::string module_name;
  std::string class_name;
  std::string function_name = "__init__";
};

template <typename R = void>
struct PyActorMethod {
  std::string function_name;
};

namespace internal {

// Wire names of Python code called from C++ (docs/python.md): functions and classes
// "py:<module>:<name>", methods of such actors "xlang:<method>".
inline constexpr const char kXlangFunctionPrefix[] = "py:";
inline constexpr const char kXlangMethodPrefix[] = "xlang:";
inline std::string XlangName(const std::string& module, const std::string& name) {
  return kXlangFunctionPrefix + module + ":" + name;
}
inline std::string XlangMethodName(const std::string& method) { return kXlangMethodPrefix + method; }

template <typename A>
TaskArg WrapXlangArg(A&& arg) {
  using AV = std::remove_cvref_t<A>;
  TaskArg out;
  if constexpr (is_object_ref_v<AV>) {
    out.is_ref = true;
    out.ref_id = arg.ID();
  } else {
    RefCollector nested;
    CollectRefs scope(&nested);
    out.value = Serializer::Serialize(arg);
    out.nested_ids = std::move(nested.ids);
  }
  return out;
}

template <typename... Args>
std::vector<TaskArg> WrapXlangArgs(Args&&... args) {
  std::vector<TaskArg> out;
  out.reserve(sizeof...(Args));
  (out.push_back(WrapXlangArg(std::forward<Args>(args))), ...);
  return out;
}

template <typename R>
class XlangTaskCaller {
 public:
  explicit XlangTaskCaller(std::string name, bool actor_method = false, std::string actor_id = "")
      : name_(std::move(name)), actor_id_(std::move(actor_id)), actor_method_(actor_method) {
    options_.language = Language::kPython;
    if (actor_method_) options_.max_retries = 0;
  }
  template <typename... Args>
  ObjectRef<R> Remote(Args&&... args) const {
    ValidateResources(options_.resources);
    auto task_args = WrapXlangArgs(std::forward<Args>(args)...);
    std::string id = actor_method_
                         ? RequireRuntime().SubmitActorTask(actor_id_, name_, std::move(task_args), options_)
                         : RequireRuntime().SubmitTask(name_, std::move(task_args), options_);
    return ObjectRefAccess::Adopt<R>(std::move(id));
  }
  XlangTaskCaller& SetName(std::string name) {
    options_.name = std::move(name);
    return *this;
  }
  XlangTaskCaller& SetResources(std::unordered_map<std::string, double> resources) {
    options_.resources = std::move(resources);
    return *this;
  }
  XlangTaskCaller& SetResource(std::string name, double value) {
    options_.resources[std::move(name)] = value;
    return *this;
  }
  XlangTaskCaller& SetMaxRetries(int max_retries) {
    options_.max_retries = max_retries;
    return *this;
  }

 private:
  std::string name_;
  std::string actor_id_;
  bool actor_method_;
  TaskOptions options_;
};

}  // namespace internal

// A handle to an actor written in another language (Python): its methods are called by name.
class ActorHandleXlang {
 public:
  ActorHandleXlang() = default;
  explicit ActorHandleXlang(std::string id) : id_(std::move(id)) {}
  const std::string& ID() const { return id_; }
  template <typename R>
  internal::XlangTaskCaller<R> Task(PyActorMethod<R> method) const {
    return internal::XlangTaskCaller<R>(internal::XlangMethodName(method.function_name),
                                        /*actor_method=*/true, id_);
  }
  void Kill() const { Kill(true); }
  void Kill(bool no_restart) const { internal::RequireRuntime().KillActor(id_, no_restart); }

 private:
  std::string id_;
};

namespace internal {

class XlangActorCreator {
 public:
  explicit XlangActorCreator(std::string name) : name_(std::move(name)) {
    options_.language = Language::kPython;
  }
  template <typename... Args>
  ActorHandleXlang Remote(Args&&... args) const {
    ValidateResources(options_.resources);
    auto task_args = WrapXlangArgs(std::forward<Args>(args)...);
    return ActorHandleXlang(RequireRuntime().CreateActor(name_, std::move(task_args), options_));
  }
  XlangActorCreator& SetName(std::string name) {
    options_.name = std::move(name);
    return *this;
  }
  XlangActorCreator& SetName(std::string name, std::string ray_namespace) {
    options_.name = std::move(name);
    options_.ray_namespace = std::move(ray_namespace);
    return *this;
  }
  XlangActorCreator& SetResources(std::unordered_map<std::string, double> resources) {
    options_.resources = std::move(resources);
    return *this;
  }
  XlangActorCreator& SetResource(std::string name, double value) {
    options_.resources[std::move(name)] = value;
    return *this;
  }
  XlangActorCreator& SetMaxRestarts(int max_restarts) {
    options_.max_restarts = max_restarts;
    return *this;
  }
  XlangActorCreator& SetMaxConcurrency(int max_concurrency) {
    options_.max_concurrency = max_concurrency;
    return *this;
  }

 private:
  std::string name_;
  ActorOptions options_;
};

}  // namespace internal

template <typename R>
internal::XlangTaskCaller<R> Task(PyFunction<R> func) {
  return internal::XlangTaskCaller<R>(internal::XlangName(func.module_name, func.function_name));
}

inline internal::XlangActorCreator Actor(PyActorClass cls) {
  return internal::XlangActorCreator(internal::XlangName(cls.module_name, cls.class_name));
}

}  // namespace torus
