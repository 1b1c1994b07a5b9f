// Executor: the language-specific part of running a task in a worker. TaskExecutor (the
// worker side of the PushTasks stream) does everything else: reading the arguments, the
// borrowing protocol, storing the result, actor bookkeeping. An Executor only finds the named
// function, actor factory or actor method and runs it on the argument bytes. CppExecutor
// (cpp_executor.h: the RAY_REMOTE function registry) is the one implementation today; a
// Python executor would be a sibling.
//
// THREADS: Invoke() is called on the thread of an inbound task stream (sequential workers and
// actors, one task at a time) or on one of a threaded actor's max_concurrency pool threads,
// concurrently. An implementation guards its own state; the actor instance is created by
// the creation task, which runs before any method call.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "proto/torus.pb.h"
#include "torus/internal/runtime.h"

namespace torus::core {

// What a task returned, packed.
struct TaskOutput {
  std::string value;  // the first (or only) return
  // A task with spec.num_returns = N > 1 (Python): returns 2 .. N, and the refs packed into
  // each of the N returns (nested.size() == N; each id is also in the thread's result-ref
  // collector, which holds it until the reply). Both empty for a single return, whose packed
  // refs are the collector's.
  std::vector<std::string> more;
  std::vector<std::vector<std::string>> nested;
  // A single return may come as a writer instead of `value`: `value_size` bytes that
  // `write_value(dst)` fills in place (Python's out-of-band buffers go from the user's memory
  // straight into the store: one copy). Called at most once, on the executing thread.
  size_t value_size = 0;
  std::function<void(char* dst)> write_value;

  static TaskOutput One(std::string v) {
    TaskOutput o;
    o.value = std::move(v);
    return o;
  }
};

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs `spec` (a function, an actor's creation or one of its methods) on `args` and returns
  // the packed result (creation: msgpack nil). NotFound when nothing of that name is
  // registered; InvalidArgument for num_returns it cannot give. User code's exceptions (and
  // ExitActorSignal) propagate to the caller.
  // args[i] is valid during the call; owners[i], when not null, is the shared-memory buffer
  // args[i] views, which an executor may keep to use the bytes after the call (zero copy).
  virtual StatusOr<TaskOutput> Invoke(
      const rpc::TaskSpec& spec, const std::vector<internal::ArgView>& args,
      const std::vector<std::shared_ptr<internal::Buffer>>& owners) = 0;
  // Interrupts task `task_id` if it is running now (ray.cancel without force); false when it
  // is not running or its language cannot be interrupted (C++: the default). Called on any
  // thread, concurrently with Invoke.
  virtual bool Interrupt(const std::string& task_id) { return false; }
};

// Thrown through user code by ray::ExitActor(); deliberately not a std::exception.
struct ExitActorSignal {};

}  // namespace torus::core
