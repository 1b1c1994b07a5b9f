// Actors: stateful workers created from a registered factory and called through a handle.
//
//   ray::ActorHandle<Counter> counter =
//       ray::Actor(Counter::FactoryCreate).SetName("counter").Remote(0);
//   ray::ObjectRef<int> n = counter.Task(&Counter::Add).Remote(3);
//   auto same = ray::GetActor<Counter>("counter");                      // boost::optional
//   counter.Kill();
//
// ActorHandle is a value (the actor id): copy it freely, pass it to tasks or return it from
// them (it is msgpack-serializable). Handles do not keep an actor alive; a non-detached actor
// lives as long as the job that created it, unless killed or exited. Actors get the job's
// default lifetime (RayConfig::default_actor_lifetime) unless SetLifetime chooses one.
//
// Calls made through handles in one process are run by the actor in submission order (with
// max_concurrency 1). All Remote() calls require Init().
#pragma once

#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>

#include <boost/callable_traits.hpp>
#include <boost/optional.hpp>
#include <msgpack.hpp>

#include "torus/api/arguments.h"
#include "torus/api/config.h"
#include "torus/api/object_ref.h"
#include "torus/api/placement_group.h"
#include "torus/api/remote.h"
#include "torus/api/runtime_env.h"
#include "torus/api/serializer.h"
#include "torus/api/task_options.h"
#include "torus/api/type_traits.h"
#include "torus/internal/runtime.h"

namespace torus {
namespace internal {

// One pending call of actor method F (a member function pointer) on one actor.
template <typename F>
class ActorTaskCaller {
 public:
  ActorTaskCaller() = default;
  ActorTaskCaller(std::string actor_id, std::string method_name)
      : actor_id_(std::move(actor_id)), method_name_(std::move(method_name)) {
    options_.max_retries = 0;  // a method call is not re-run after the actor dies
  }

  template <typename... Args>
  ObjectRef<RemoteReturn<F>> Remote(Args&&... args) const {
    ValidateResources(options_.resources);
    std::vector<TaskArg> task_args = WrapArgs<F>(std::forward<Args>(args)...);
    std::string id = RequireRuntime().SubmitActorTask(actor_id_, method_name_,
                                                      std::move(task_args), options_);
    return ObjectRefAccess::Adopt<RemoteReturn<F>>(std::move(id));
  }

  ActorTaskCaller& SetName(std::string name) {
    options_.name = std::move(name);
    return *this;
  }
  ActorTaskCaller& SetResources(std::unordered_map<std::string, double> resources) {
    options_.resources = std::move(resources);
    return *this;
  }
  ActorTaskCaller& SetResource(std::string name, double value) {
    options_.resources[std::move(name)] = value;
    return *this;
  }

 private:
  std::string actor_id_;
  std::string method_name_;
  TaskOptions options_;
};

}  // namespace internal

template <typename ActorType>
class ActorHandle {
 public:
  ActorHandle() = default;
  ActorHandle(const std::string& id) : id_(id) {}  // NOLINT: implicit, as in Ray

  // Marks the type for Ray-style trait checks.
  static bool IsActorHandle() { return true; }

  // The actor id; "" for a default-constructed handle.
  const std::string& ID() const { return id_; }

  bool operator==(const ActorHandle& other) const { return id_ == other.id_; }

  // A caller for method `actor_func` (&ActorType::Method, or a method of a base class), which
  // must be registered with RAY_REMOTE; throws RayFunctionNotFound otherwise.
  template <typename F>
  internal::ActorTaskCaller<F> Task(F actor_func) const {
    static_assert(std::is_member_function_pointer_v<F>,
                  "ActorHandle::Task takes a member function pointer, e.g. &Counter::Add");
    using Owner = boost::callable_traits::class_of_t<F>;
    static_assert(std::is_same_v<Owner, ActorType> || std::is_base_of_v<Owner, ActorType>,
                  "ActorHandle<T>::Task: the method is not a member of T or of a base of T");
    return internal::ActorTaskCaller<F>(id_, internal::RemoteNameOf(actor_func));
  }

  // Kills the actor; pending and future calls fail with RayActorException. With
  // no_restart=false the actor may be restarted if it has restarts left.
  void Kill() const { Kill(true); }
  void Kill(bool no_restart) const { internal::RequireRuntime().KillActor(id_, no_restart); }

  // A handle from its serialized form, which in Torus is the actor id itself.
  static ActorHandle FromBytes(const std::string& serialized_actor_handle) {
    return ActorHandle(serialized_actor_handle);
  }

 private:
  std::string id_;
};

namespace internal {

template <typename F>
class ActorCreator {
 public:
  using ActorType = FactoryClass<F>;

  ActorCreator() = default;
  explicit ActorCreator(std::string factory_name) : factory_name_(std::move(factory_name)) {}

  // Creates the actor and returns its handle without waiting for the factory to run; a
  // factory that throws makes the handle's calls fail with RayActorException.
  template <typename... Args>
  ActorHandle<ActorType> Remote(Args&&... args) const {
    ValidateResources(options_.resources);
    std::vector<TaskArg> task_args = WrapArgs<F>(std::forward<Args>(args)...);
    std::string actor_id =
        RequireRuntime().CreateActor(factory_name_, std::move(task_args), options_);
    return ActorHandle<ActorType>(actor_id);
  }

  // Names the actor in the job's namespace, so GetActor(name) finds it.
  ActorCreator& SetName(std::string name) {
    options_.name = std::move(name);
    return *this;
  }
  // Names the actor in the namespace `ray_namespace`.
  ActorCreator& SetName(std::string name, std::string ray_namespace) {
    options_.name = std::move(name);
    options_.ray_namespace = std::move(ray_namespace);
    return *this;
  }
  ActorCreator& SetResources(std::unordered_map<std::string, double> resources) {
    options_.resources = std::move(resources);
    return *this;
  }
  ActorCreator& SetResource(std::string name, double value) {
    options_.resources[std::move(name)] = value;
    return *this;
  }
  // Restarts after the actor's process dies (-1: no limit). Default 0.
  ActorCreator& SetMaxRestarts(int max_restarts) {
    ValidateRetryCount("SetMaxRestarts", max_restarts);
    options_.max_restarts = max_restarts;
    return *this;
  }
  // Calls the actor may run at once, on separate threads. Default 1.
  ActorCreator& SetMaxConcurrency(int max_concurrency) {
    if (max_concurrency < 1) {
      throw RayException("SetMaxConcurrency must be at least 1, got " +
                         std::to_string(max_concurrency));
    }
    options_.max_concurrency = max_concurrency;
    return *this;
  }
  ActorCreator& SetPlacementGroup(PlacementGroup group, int bundle_index) {
    options_.placement_group_id = group.GetID();
    options_.bundle_index = bundle_index;
    return *this;
  }
  // The actor's process runs with `runtime_env`: its env_vars are merged over the job's
  // (RayConfig::runtime_env), as in Ray. Throws RayRuntimeEnvException for fields Torus does
  // not support (everything but env_vars and config).
  ActorCreator& SetRuntimeEnv(const RuntimeEnv& runtime_env) {
    CheckSupportedRuntimeEnv(runtime_env);
    options_.serialized_runtime_env = runtime_env.Serialize();
    return *this;
  }
  // DETACHED actors outlive the job. Without this call the actor gets
  // RayConfig::default_actor_lifetime (or --ray_default_actor_lifetime).
  ActorCreator& SetLifetime(ActorLifetime lifetime) {
    options_.detached = lifetime == ActorLifetime::DETACHED;
    options_.lifetime_set = true;
    return *this;
  }
  // Torus extension: only nodes whose labels match every term may host the actor.
  ActorCreator& SetLabelSelector(std::unordered_map<std::string, std::string> label_selector) {
    options_.label_selector = std::move(label_selector);
    return *this;
  }

 private:
  std::string factory_name_;
  ActorOptions options_;
};

}  // namespace internal

// A creator for actors made by the registered factory `create_func`, a function returning T*
// (or RAY_FUNC(...) naming one overload of it).
template <typename F>
internal::ActorCreator<F> Actor(F create_func) {
  static_assert(internal::is_factory_v<F>,
                "ray::Actor takes a factory function returning a pointer to the actor class, "
                "e.g. static Counter* FactoryCreate(int), registered with RAY_REMOTE");
  return internal::ActorCreator<F>(internal::RemoteNameOf(create_func));
}

// The actor named `actor_name` in namespace `ray_namespace` ("" = this job's namespace), or
// none when no live actor has that name. T is not checked against the actor's real class.
template <typename T>
boost::optional<ActorHandle<T>> GetActor(const std::string& actor_name,
                                         const std::string& ray_namespace) {
  if (actor_name.empty()) return boost::none;
  std::string actor_id = internal::RequireRuntime().GetNamedActor(actor_name, ray_namespace);
  if (actor_id.empty()) return boost::none;
  return ActorHandle<T>(actor_id);
}

template <typename T>
boost::optional<ActorHandle<T>> GetActor(const std::string& actor_name) {
  return GetActor<T>(actor_name, "");
}

// Implemented by the core library.
// Exits the current actor; does not return. In a driver or a task that is not an actor's,
// throws RayException.
void ExitActor();
// True when this actor process is a restart (after a crash, with max_restarts left).
bool WasCurrentActorRestarted();

}  // namespace torus

namespace msgpack {
MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS) {
namespace adaptor {

template <typename T>
struct pack<torus::ActorHandle<T>> {
  template <typename Stream>
  packer<Stream>& operator()(packer<Stream>& o, const torus::ActorHandle<T>& handle) const {
    torus::internal::PackIdExt(o, torus::internal::kActorHandleExtType, handle.ID());
    return o;
  }
};

template <typename T>
struct convert<torus::ActorHandle<T>> {
  const msgpack::object& operator()(const msgpack::object& o,
                                    torus::ActorHandle<T>& handle) const {
    handle = torus::ActorHandle<T>(
        torus::internal::UnpackIdExt(o, torus::internal::kActorHandleExtType));
    return o;
  }
};

}  // namespace adaptor
}  // MSGPACK_API_VERSION_NAMESPACE(MSGPACK_DEFAULT_API_NS)
}  // namespace msgpack
