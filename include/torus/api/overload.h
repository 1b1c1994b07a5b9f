// RAY_FUNC(f, ArgTypes...): names one overload of an overloaded function by its parameter
// types, for use with RAY_REMOTE, ray::Task and ray::Actor.
//
//   static Counter* FactoryCreate();
//   static Counter* FactoryCreate(int init);
//   RAY_REMOTE(RAY_FUNC(Counter::FactoryCreate), RAY_FUNC(Counter::FactoryCreate, int));
//   auto counter = ray::Actor(RAY_FUNC(Counter::FactoryCreate, int)).Remote(1);
//
// Works for free functions, static member functions and (with `&`) member functions, const or
// not. Overloads that differ only in cv- or ref-qualification of `this` cannot be told apart.
#pragma once

namespace torus::internal {

template <typename... Params>
struct OverloadSelector {
  template <typename R>
  constexpr auto operator()(R (*f)(Params...)) const {
    return f;
  }
  template <typename R, typename C>
  constexpr auto operator()(R (C::*f)(Params...)) const {
    return f;
  }
  template <typename R, typename C>
  constexpr auto operator()(R (C::*f)(Params...) const) const {
    return f;
  }
};

template <typename... Params>
inline constexpr OverloadSelector<Params...> SelectOverload{};

}  // namespace torus::internal

// Inside RAY_REMOTE the text itself, e.g. "RAY_FUNC(Counter::FactoryCreate,int)", becomes the
// overload's wire name.
#define RAY_FUNC(f, ...) ::torus::internal::SelectOverload<__VA_ARGS__>(f)
