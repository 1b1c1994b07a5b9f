// How the arguments of Remote(...) become TaskArgs, and the compile-time checks that make a
// call with the wrong number or types of arguments fail where it is written.
//
// For parameter i of the remote function, declared P (compared without reference and cv):
//   - an ObjectRef<X> argument for a P that is not an ObjectRef is passed by reference: the
//     runtime resolves the object and the function receives its value (X must be P, or both
//     non-bool arithmetic types with no float-to-integer narrowing, as msgpack converts those);
//   - any other argument is converted to P as a call would convert it and packed by value; an
//     ObjectRef argument for an ObjectRef parameter is therefore sent as a nested reference;
//   - except for a std::any parameter: an argument of another type is packed as that type (as
//     Ray does), and the function receives the std::any unpacking gives (see serializer.h).
#pragma once

#include <any>
#include <cstddef>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "torus/api/exceptions.h"
#include "torus/api/object_ref.h"
#include "torus/api/serializer.h"
#include "torus/api/type_traits.h"
#include "torus/internal/runtime.h"

namespace torus::internal {

template <typename X, typename P>
inline constexpr bool kRefValueFits =
    std::is_same_v<X, P> ||
    (std::is_arithmetic_v<X> && std::is_arithmetic_v<P> && !std::is_same_v<X, bool> &&
     !std::is_same_v<P, bool> && !(std::is_floating_point_v<X> && std::is_integral_v<P>));

// Whether an argument expression of type A (as forwarded) may be passed for parameter P.
template <typename P, typename A>
constexpr bool ArgFits() {
  using PV = std::remove_cvref_t<P>;
  using AV = std::remove_cvref_t<A>;
  if constexpr (is_object_ref_v<AV> && !is_object_ref_v<PV>) {
    using X = typename ObjectRefTraits<AV>::value_type;
    if constexpr (std::is_void_v<X>) {
      return false;
    } else {
      return kRefValueFits<X, PV>;
    }
  } else {
    return std::is_convertible_v<A, PV>;
  }
}

// Instantiated once per argument so the compiler's note names the position and both types.
template <size_t Position, typename Parameter, typename Argument>
struct RemoteArgumentCheck {
  static constexpr bool ok = ArgFits<Parameter, Argument>();
  static_assert(ok,
                "Remote(...): this argument does not fit the remote function's parameter (see "
                "Position (from 0), Parameter and Argument in this instantiation; an "
                "ObjectRef<X> argument needs a parameter of type X or ObjectRef<X>)");
};

template <typename P, typename A>
TaskArg WrapArg(size_t position, A&& arg) {
  using PV = std::remove_cvref_t<P>;
  using AV = std::remove_cvref_t<A>;
  TaskArg out;
  if constexpr (is_object_ref_v<AV> && !is_object_ref_v<PV>) {
    if (arg.ID().empty()) {
      throw RayException("argument " + std::to_string(position + 1) + " is an empty ObjectRef");
    }
    out.is_ref = true;
    out.ref_id = arg.ID();
  } else if constexpr (std::is_same_v<PV, std::any> && !std::is_same_v<AV, std::any>) {
    // As in Ray: the argument is packed as its own type and arrives as the std::any that
    // unpacking gives (an int 5 becomes a uint64_t 5), not as a std::any holding an int.
    out.value = Serializer::Serialize(arg);
  } else if constexpr (!kMayHoldRefs<PV>) {
    if constexpr (std::is_same_v<AV, PV>) {
      out.value = Serializer::Serialize(arg);
    } else {
      const PV converted = std::forward<A>(arg);
      out.value = Serializer::Serialize(converted);
    }
  } else {
    // Refs packed inside the value are recorded: the runtime keeps them alive until the task
    // has run (the executor registers as a borrower of them).
    RefCollector nested;
    CollectRefs scope(&nested);
    if constexpr (std::is_same_v<AV, PV>) {
      out.value = Serializer::Serialize(arg);
    } else {
      const PV converted = std::forward<A>(arg);
      out.value = Serializer::Serialize(converted);
    }
    out.nested_ids = std::move(nested.ids);
  }
  return out;
}

// F is the remote function (or member function) type; Args are the Remote(...) argument types.
template <typename F, typename... Args>
std::vector<TaskArg> WrapArgs(Args&&... args) {
  if constexpr (sizeof...(Args) != kArity<F>) {
    static_assert(sizeof...(Args) == kArity<F>,
                  "Remote(...): wrong number of arguments for this remote function");
    return {};
  } else {
    using Params = DeclaredParams<F>;
    std::vector<TaskArg> out;
    out.reserve(sizeof...(Args));
    [&]<size_t... I>(std::index_sequence<I...>) {
      constexpr bool checked =
          (RemoteArgumentCheck<I, std::tuple_element_t<I, Params>, Args>::ok && ...);
      if constexpr (checked) {  // skip the follow-on errors of a failed check
        (out.push_back(WrapArg<std::tuple_element_t<I, Params>>(I, std::forward<Args>(args))),
         ...);
      }
    }(std::index_sequence_for<Args...>{});
    return out;
  }
}

}  // namespace torus::internal
