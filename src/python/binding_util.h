// Conversions between Python values and the runtime's types for torus._core, the translation of
// the runtime's exceptions into Python ones, and the module's cluster calls (cluster_calls.cc).
//
// THREADS: called with the GIL held.
#pragma once

#include <nanobind/nanobind.h>

#include <vector>

#include "core/core_worker.h"
#include "torus/internal/runtime.h"

namespace torus::python {

// This process's core worker; raises torus._core.Error when not initialized.
core::CoreWorker& Require();

// Task arguments: items (False, value_bytes, nested_ids) or (True, object_id, []).
std::vector<internal::TaskArg> ToArgs(nanobind::list args);
// Options dicts (keys as in docs/python.md); unknown keys raise ValueError naming them.
internal::TaskOptions ToTaskOptions(nanobind::dict options);
internal::ActorOptions ToActorOptions(nanobind::dict options);

// Defines Error, TaskError, ActorDiedError, WorkerCrashedError, ObjectLostError,
// GetTimeoutError, RuntimeEnvError, SliceLostError, FunctionNotFoundError, TaskCancelledError
// and translates the runtime's C++ exceptions to them.
void BindExceptions(nanobind::module_& m);
// Named actors, kill, placement groups, slices, the KV store, nodes.
void BindCluster(nanobind::module_& m);

}  // namespace torus::python
