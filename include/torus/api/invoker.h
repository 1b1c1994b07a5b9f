// The type-erased callers that RAY_REMOTE stores in the FunctionRegistry. A worker runs a task
// by looking its wire name up and passing the argument bytes; the invoker unpacks each argument
// as the declared parameter type (without reference and cv), calls the C++ entity, and packs
// the result (msgpack nil for void).
//
// Errors: a wrong argument count or an argument that does not convert throws RayException
// naming the function and the argument; exceptions thrown by the user's code propagate
// unchanged (the runtime turns them into RayTaskException for the caller).
#pragma once

#include <cstddef>
#include <functional>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "torus/api/exceptions.h"
#include "torus/api/serializer.h"
#include "torus/api/type_traits.h"
#include "torus/internal/runtime.h"

namespace torus::internal {

// Compile-time limits on what can be a remote function's parameter or result.
template <typename F>
constexpr void CheckRemoteParameters() {
  constexpr bool no_pointer_params = []<size_t... I>(std::index_sequence<I...>) {
    return (!std::is_pointer_v<std::tuple_element_t<I, ValueParams<F>>> && ...);
  }(std::make_index_sequence<kArity<F>>{});
  static_assert(no_pointer_params,
                "RAY_REMOTE: parameters of a remote function must be values or references, not "
                "pointers (a pointer means nothing in another process)");
}

inline void CheckArgCount(const std::string& name, size_t expected, size_t received) {
  if (expected != received) {
    throw RayException("remote function '" + name + "' takes " + std::to_string(expected) +
                       " argument(s) but was sent " + std::to_string(received));
  }
}

template <typename T>
T UnpackArg(const std::string& name, size_t index, const ArgView& view) {
  try {
    return Serializer::Deserialize<T>(view.data, view.size);
  } catch (const RayException& e) {
    throw RayException("argument " + std::to_string(index + 1) + " of remote function '" + name +
                       "': " + e.msg_);
  }
}

// Unpacks all arguments, in order, into a tuple of value types.
template <typename F, size_t... I>
ValueParams<F> UnpackArgs(const std::string& name, const std::vector<ArgView>& args,
                          std::index_sequence<I...>) {
  CheckArgCount(name, sizeof...(I), args.size());
  return ValueParams<F>{UnpackArg<std::tuple_element_t<I, ValueParams<F>>>(name, I, args[I])...};
}

// Calls `callable` with the unpacked values, each forwarded as its declared parameter type (so
// by-value and rvalue-reference parameters receive moved values).
template <typename F, typename Callable, size_t... I>
decltype(auto) CallWithValues(Callable&& callable, ValueParams<F>& values,
                              std::index_sequence<I...>) {
  (void)values;
  return std::forward<Callable>(callable)(
      std::forward<std::tuple_element_t<I, DeclaredParams<F>>>(std::get<I>(values))...);
}

template <typename F, typename Call>
std::string PackResultOf(Call&& call) {
  if constexpr (std::is_void_v<typename RemoteSignature<F>::Return>) {
    call();
    return Serializer::SerializeNil();
  } else if constexpr (!kMayHoldRefs<typename RemoteSignature<F>::Return>) {
    return Serializer::Serialize(call());
  } else {
    // The user's code runs first, with no collector; then packing the value records the refs
    // inside it (held, since the value and its ObjectRefs die when this returns).
    decltype(auto) value = call();
    CollectRefs scope(ResultRefCollector());
    return Serializer::Serialize(value);
  }
}

template <typename F>
FunctionInvoker MakeFunctionInvoker(F function, std::string name) {
  static_assert(is_function_pointer_v<F>);
  CheckRemoteParameters<F>();
  static_assert(!std::is_pointer_v<typename RemoteSignature<F>::Return>,
                "RAY_REMOTE: a remote function cannot return a pointer (only actor factories "
                "return T*, and those must return a pointer to a class)");
  return [function, name = std::move(name)](const std::vector<ArgView>& args) -> std::string {
    constexpr auto indices = std::make_index_sequence<kArity<F>>{};
    ValueParams<F> values = UnpackArgs<F>(name, args, indices);
    return PackResultOf<F>([&]() -> decltype(auto) {
      return CallWithValues<F>(function, values, indices);
    });
  };
}

template <typename T>
void DeleteActorInstance(void* instance) {
  delete static_cast<T*>(instance);
}

template <typename F>
FactoryInvoker MakeFactoryInvoker(F factory, std::string name) {
  static_assert(is_factory_v<F>);
  CheckRemoteParameters<F>();
  using T = FactoryClass<F>;
  return [factory, name = std::move(name)](const std::vector<ArgView>& args) -> ActorInstance {
    constexpr auto indices = std::make_index_sequence<kArity<F>>{};
    ValueParams<F> values = UnpackArgs<F>(name, args, indices);
    T* instance = CallWithValues<F>(factory, values, indices);
    if (instance == nullptr) throw RayException("actor factory '" + name + "' returned null");
    return ActorInstance{instance, &DeleteActorInstance<T>};
  };
}

// `self` must be the instance made by the actor's factory. When the method belongs to a base
// class of the actor, that base must sit at offset 0 of the actor (single inheritance).
template <typename M>
MethodInvoker MakeMethodInvoker(M method, std::string name) {
  static_assert(std::is_member_function_pointer_v<M>);
  CheckRemoteParameters<M>();
  static_assert(!std::is_pointer_v<typename RemoteSignature<M>::Return>,
                "RAY_REMOTE: an actor method cannot return a pointer");
  using C = boost::callable_traits::class_of_t<M>;
  return [method, name = std::move(name)](void* self,
                                          const std::vector<ArgView>& args) -> std::string {
    if (self == nullptr) throw RayException("actor method '" + name + "' called without actor");
    constexpr auto indices = std::make_index_sequence<kArity<M>>{};
    ValueParams<M> values = UnpackArgs<M>(name, args, indices);
    C* object = static_cast<C*>(self);
    auto bound = [object, method](auto&&... forwarded) -> decltype(auto) {
      return (object->*method)(std::forward<decltype(forwarded)>(forwarded)...);
    };
    return PackResultOf<M>([&]() -> decltype(auto) {
      return CallWithValues<M>(bound, values, indices);
    });
  };
}

}  // namespace torus::internal
