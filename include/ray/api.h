// Ray-compatible entry point: a program written against Ray's C++ API (`#include <ray/api.h>`,
// ray::Init, ray::Task, ray::ObjectRef<T>, ray::internal::RayTaskException, ...) compiles
// unchanged against Torus. Every ray:: name is the torus:: entity of the same name; qualified
// lookup in `ray` follows the using-directive below (ray::internal finds torus::internal).
//
// Cross-language calls into Python (ray::PyFunction, ray::PyActorClass, ray::PyActorMethod,
// ray::ActorHandleXlang) are in torus/api/xlang.h. Not provided: Java (ray::JavaFunction, ...),
// metrics (ray/api/metric.h), and the individual <ray/api/*.h> headers.
#pragma once

#include <torus/api.h>

// Ray's headers pull these in and Ray programs rely on it (its example uses std::cout after
// including only <ray/api.h>).
#include <functional>
#include <iostream>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

namespace ray {
using namespace ::torus;  // NOLINT(google-build-using-namespace): the whole point of this header
}  // namespace ray
