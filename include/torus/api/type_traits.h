// Compile-time facts about remote functions and API types, shared by the call-site templates
// (Task, Actor, ActorHandle::Task) and the invokers that RAY_REMOTE registers.
#pragma once

#include <cstddef>
#include <tuple>
#include <type_traits>

#include <boost/callable_traits.hpp>

namespace torus {
template <typename T>
class ObjectRef;
template <typename ActorType>
class ActorHandle;
}  // namespace torus

namespace torus::internal {

template <typename T>
struct ObjectRefTraits : std::false_type {};
template <typename T>
struct ObjectRefTraits<ObjectRef<T>> : std::true_type {
  using value_type = T;
};
template <typename T>
inline constexpr bool is_object_ref_v = ObjectRefTraits<std::remove_cvref_t<T>>::value;

template <typename T>
struct ActorHandleTraits : std::false_type {};
template <typename T>
struct ActorHandleTraits<ActorHandle<T>> : std::true_type {};
template <typename T>
inline constexpr bool is_actor_handle_v = ActorHandleTraits<std::remove_cvref_t<T>>::value;

template <bool Drop, typename Tuple>
struct DropFirstIf {
  using type = Tuple;
};
template <typename First, typename... Rest>
struct DropFirstIf<true, std::tuple<First, Rest...>> {
  using type = std::tuple<Rest...>;
};

// Everything the API needs to know about a remote function, factory or member function F.
// (A class rather than bare boost::callable_traits aliases keeps compiler messages short.)
template <typename F>
struct RemoteSignature {
  using Return = boost::callable_traits::return_type_t<F>;
  // Parameter types as declared (references kept). For a member function the object
  // parameter that boost::callable_traits puts first is dropped.
  using Declared = typename DropFirstIf<std::is_member_function_pointer_v<F>,
                                        boost::callable_traits::args_t<F>>::type;
  static constexpr size_t arity = std::tuple_size_v<Declared>;
};

template <typename Tuple>
struct RemoveCvrefEach;
template <typename... T>
struct RemoveCvrefEach<std::tuple<T...>> {
  using type = std::tuple<std::remove_cvref_t<T>...>;
};

template <typename F>
using DeclaredParams = typename RemoteSignature<F>::Declared;

// Parameter types as values travel: without references or cv-qualifiers.
template <typename F>
using ValueParams = typename RemoveCvrefEach<typename RemoteSignature<F>::Declared>::type;

template <typename F>
inline constexpr size_t kArity = RemoteSignature<F>::arity;

// What a remote call of F yields: its return type without reference or cv-qualifiers.
template <typename F>
using RemoteReturn = std::remove_cvref_t<typename RemoteSignature<F>::Return>;

template <typename F>
inline constexpr bool is_function_pointer_v =
    std::is_pointer_v<F> && std::is_function_v<std::remove_pointer_t<F>>;

// A factory is a free function returning a pointer to a class: RAY_REMOTE registers it as an
// actor constructor, ray::Actor accepts it. `Class` is the actor class it creates.
template <typename F, typename = void>
struct FactoryTraits : std::false_type {};
template <typename F>
struct FactoryTraits<F, std::enable_if_t<is_function_pointer_v<F>>>
    : std::bool_constant<std::is_pointer_v<typename RemoteSignature<F>::Return> &&
                         std::is_class_v<std::remove_pointer_t<
                             typename RemoteSignature<F>::Return>>> {
  using Class = std::remove_cv_t<std::remove_pointer_t<typename RemoteSignature<F>::Return>>;
};
template <typename F>
inline constexpr bool is_factory_v = FactoryTraits<F>::value;

template <typename F>
using FactoryClass = typename FactoryTraits<F>::Class;

template <typename T>
inline constexpr bool kDependentFalse = false;

}  // namespace torus::internal
