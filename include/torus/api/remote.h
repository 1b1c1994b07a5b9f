// RAY_REMOTE(...): declares which functions may run remotely. Write it once per function at
// namespace scope, in a source file (or header) linked into the driver and the workers alike:
//
//   int Plus(int x, int y) { return x + y; }
//   RAY_REMOTE(Plus);
//   RAY_REMOTE(Counter::FactoryCreate, &Counter::Add, RAY_FUNC(Overloaded, int));
//
// Each entry is one of
//   - a free (or static member) function: a task, run with ray::Task(f);
//   - a free (or static member) function returning T* for a class T: an actor factory, run with
//     ray::Actor(f);
//   - a member function pointer &T::m: an actor method, run with handle.Task(&T::m).
//
// Registration happens during static initialisation. The entry's text, with insignificant
// whitespace removed, is its wire name ("Plus", "Counter::FactoryCreate", "&Counter::Add",
// "RAY_FUNC(Overloaded,int)"): the driver and the workers must spell an entry the same way.
// Registering the same function twice under the same name (e.g. RAY_REMOTE in a header) is
// harmless; two different functions under one name, or one function under two names, are
// reported by an exception during static initialisation.
#pragma once

#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <utility>
#include <vector>

#include <boost/callable_traits.hpp>

#include "torus/api/exceptions.h"
#include "torus/api/invoker.h"
#include "torus/api/overload.h"
#include "torus/api/serializer.h"
#include "torus/api/type_traits.h"
#include "torus/internal/runtime.h"

namespace torus::internal {

// Splits the stringified RAY_REMOTE arguments at the commas the preprocessor split them at
// (those outside parentheses) and drops whitespace that does not separate two identifier
// characters, so "RAY_FUNC( f , int )" and "RAY_FUNC(f,int)" name the same thing.
inline std::vector<std::string> SplitRemoteNames(std::string_view text) {
  auto is_word = [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '_';
  };
  auto is_space = [](char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
  };
  std::vector<std::string> names;
  std::string current;
  int depth = 0;
  bool pending_space = false;
  for (char c : text) {
    if (is_space(c)) {
      pending_space = true;
      continue;
    }
    if (c == ',' && depth == 0) {
      names.push_back(std::move(current));
      current.clear();
      pending_space = false;
      continue;
    }
    if (c == '(') ++depth;
    if (c == ')') --depth;
    if (pending_space && !current.empty() && is_word(current.back()) && is_word(c)) {
      current += ' ';
    }
    pending_space = false;
    current += c;
  }
  names.push_back(std::move(current));
  return names;
}

// Process-local identity of a C++ entity: 'f' and the bytes of a function pointer, or 'm', the
// class's type name, NUL and the bytes of a member function pointer. The class is needed
// because pointers to virtual functions of unrelated classes can have identical bytes (a vtable
// offset); its name rather than an address keeps keys equal across shared libraries.
template <typename F>
std::string FunctionKey(F function) {
  static_assert(is_function_pointer_v<F>);
  std::string key(1 + sizeof(F), 'f');
  std::memcpy(key.data() + 1, &function, sizeof(F));
  return key;
}

template <typename M>
std::string MethodKey(M method) {
  static_assert(std::is_member_function_pointer_v<M>);
  using C = boost::callable_traits::class_of_t<M>;
  std::string key = std::string("m") + typeid(C).name();
  key.push_back('\0');
  const size_t prefix = key.size();
  key.resize(prefix + sizeof(M));
  std::memcpy(key.data() + prefix, &method, sizeof(M));
  return key;
}

template <typename F>
std::string KeyOf(F function) {
  if constexpr (std::is_member_function_pointer_v<F>) {
    return MethodKey(function);
  } else {
    return FunctionKey(function);
  }
}

// Wire name of a registered entity; throws RayFunctionNotFound (naming the C++ type, since the
// name is exactly what is unknown) when it was not registered with RAY_REMOTE.
template <typename F>
std::string RemoteNameOf(F function) {
  try {
    return FunctionRegistry::Instance().NameOf(KeyOf(function));
  } catch (const RayFunctionNotFound& e) {
    throw RayFunctionNotFound(e.msg_ + " [C++ type: " + TypeName<F>() + "]");
  }
}

template <typename F>
void RegisterOne(std::string name, F function) {
  FunctionRegistry& registry = FunctionRegistry::Instance();
  if constexpr (std::is_member_function_pointer_v<F>) {
    MethodInvoker invoker = MakeMethodInvoker(function, name);
    registry.RegisterMethod(MethodKey(function), std::move(name), std::move(invoker));
  } else if constexpr (is_factory_v<F>) {
    FactoryInvoker invoker = MakeFactoryInvoker(function, name);
    registry.RegisterFactory(FunctionKey(function), std::move(name), std::move(invoker));
  } else if constexpr (is_function_pointer_v<F>) {
    FunctionInvoker invoker = MakeFunctionInvoker(function, name);
    registry.RegisterFunction(FunctionKey(function), std::move(name), std::move(invoker));
  } else {
    static_assert(kDependentFalse<F>,
                  "RAY_REMOTE accepts free or static functions, actor factories returning T*, "
                  "member function pointers (&Class::Method) and RAY_FUNC(...); not lambdas or "
                  "other callables");
  }
}

template <typename... Fs>
bool RegisterRemote(std::string_view spelling, Fs... functions) {
  std::vector<std::string> names = SplitRemoteNames(spelling);
  if (names.size() != sizeof...(Fs)) {
    throw RayException("RAY_REMOTE(" + std::string(spelling) + "): could not split into " +
                       std::to_string(sizeof...(Fs)) + " names");
  }
  size_t index = 0;
  (RegisterOne(std::move(names[index++]), functions), ...);
  return true;
}

}  // namespace torus::internal

#define TORUS_INTERNAL_CONCAT_(a, b) a##b
#define TORUS_INTERNAL_CONCAT(a, b) TORUS_INTERNAL_CONCAT_(a, b)

// A static (internal-linkage) variable per use, so RAY_REMOTE in a header registers once per
// translation unit (idempotently) and uses in different headers never share a variable. Ends
// with its own ';' as Ray's does, so both `RAY_REMOTE(f)` and `RAY_REMOTE(f);` compile.
#define RAY_REMOTE(...)                                                              \
  [[maybe_unused]] static const bool TORUS_INTERNAL_CONCAT(torus_remote_registered_, \
                                                           __COUNTER__) =            \
      ::torus::internal::RegisterRemote(#__VA_ARGS__, __VA_ARGS__);
