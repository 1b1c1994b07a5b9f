// Cancel: stops a task that was submitted and has not ended (Torus extension: Ray's C++ API has
// no cancel; this is Python's ray.cancel). May be called from any thread; requires Init().
//
//   auto ref = torus::Task(LongJob).Remote();
//   torus::Cancel(ref);                       // Get(ref) now throws TaskCancelledException
//
// A task not yet running never runs. A running one is interrupted where its language allows
// (a Python task gets KeyboardInterrupt; C++ code runs on, its value is dropped), or with
// `force` its worker is killed (not for actor calls: that throws RayInvalidArgumentException,
// as Ray's Python API raises ValueError; ActorHandle::Kill ends an actor). With `recursive`,
// the tasks it submitted are cancelled the same way, and theirs in turn. A task that had
// already ended is left as it is (its value stays).
#pragma once

#include "torus/api/exceptions.h"
#include "torus/api/object_ref.h"
#include "torus/internal/runtime.h"

namespace torus {

template <typename T>
void Cancel(const ObjectRef<T>& ref, bool force = false, bool recursive = true) {
  if (ref.ID().empty()) throw internal::RayException("an empty ObjectRef was passed to Cancel");
  internal::RequireRuntime().Cancel(ref.ID(), force, recursive);
}

}  // namespace torus
