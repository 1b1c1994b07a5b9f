// PyExecutor: the Python sibling of CppExecutor (core/executor.h). Runs a task by calling the
// Python function the worker registered (`torus._private.executor.execute`, docs/python.md):
//   execute(kind, name, actor_id, args, max_concurrency, num_returns)
//       -> (value_bytes, status, nested_ids[, value])
// kind 0 a function, 1 an actor's creation, 2 an actor method; args are the encoded values
// (bytes, or a Value over shared memory, zero copy); status 0 a value, 1 a user exception
// (the value is an encoded exception), 2 the actor exits (ray.actor.exit_actor()). With
// num_returns > 1 (functions and methods), value_bytes and nested_ids are lists, one entry per
// return. `value` keeps the ObjectRefs packed in it alive until Invoke holds their ids.
//
// THREADS: Invoke runs on the task's thread (the stream's, or a threaded actor's pool thread)
// and holds the GIL while Python runs; nothing else is shared.
#pragma once

#include <nanobind/nanobind.h>

#include "core/executor.h"

namespace torus::python {

// The task running on the calling thread (set while PyExecutor runs it), or null.
const rpc::TaskSpec* CurrentTaskSpec();
// Workers hosting an actor: its creation task (kept once the actor was created), or null.
const rpc::TaskSpec* ActorCreationSpec();

class PyExecutor final : public core::Executor {
 public:
  // `execute` stays referenced for the life of the process (workers never return).
  explicit PyExecutor(nanobind::object execute);
  StatusOr<core::TaskOutput> Invoke(
      const rpc::TaskSpec& spec, const std::vector<internal::ArgView>& args,
      const std::vector<std::shared_ptr<internal::Buffer>>& owners) override;

 private:
  PyObject* execute_;  // a strong reference, never released
};

}  // namespace torus::python
