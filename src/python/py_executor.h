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
// and holds the GIL while Python runs; Interrupt runs on a gRPC thread and takes the GIL. The
// table of running tasks they share has its own mutex.
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
  // `execute` (and `cancel_async`, when not None) stay referenced for the life of the process
  // (workers never return). cancel_async(thread_ident) -> bool cancels the async actor call
  // that thread waits for.
  PyExecutor(nanobind::object execute, nanobind::object cancel_async);
  StatusOr<core::TaskOutput> Invoke(
      const rpc::TaskSpec& spec, const std::vector<internal::ArgView>& args,
      const std::vector<std::shared_ptr<internal::Buffer>>& owners) override;
  // A task: KeyboardInterrupt raised in its thread (at its next Python instruction: a thread
  // blocked in one long C call sees it when the call returns). An async actor's call: its
  // coroutine is cancelled. Sync actor calls and creations: false (run on, as in Ray).
  bool Interrupt(const std::string& task_id) override;

 private:
  PyObject* execute_;       // strong references, never released
  PyObject* cancel_async_;  // or null
};

}  // namespace torus::python
