// WaitResult<T>: what ray::Wait returns. `ready` holds the references whose objects (values or
// errors) were available, `unready` the rest, each in the order they were given to Wait.
#pragma once

#include <list>
#include <utility>

#include "torus/api/object_ref.h"

namespace torus {

template <typename T>
class WaitResult {
 public:
  std::list<ObjectRef<T>> ready;
  std::list<ObjectRef<T>> unready;

  WaitResult() = default;
  WaitResult(std::list<ObjectRef<T>>&& ready_objects, std::list<ObjectRef<T>>&& unready_objects)
      : ready(std::move(ready_objects)), unready(std::move(unready_objects)) {}
};

}  // namespace torus
