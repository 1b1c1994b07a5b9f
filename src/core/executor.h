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

#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "proto/torus.pb.h"
#include "torus/internal/runtime.h"

namespace torus::core {

class Executor {
 public:
  virtual ~Executor() = default;
  // Runs `spec` (a function, an actor's creation or one of its methods) on `args` and returns
  // the packed result (creation: msgpack nil). NotFound when nothing of that name is
  // registered. User code's exceptions (and ExitActorSignal) propagate to the caller.
  // args[i] is valid during the call; owners[i], when not null, is the shared-memory buffer
  // args[i] views, which an executor may keep to use the bytes after the call (zero copy).
  virtual StatusOr<std::string> Invoke(
      const rpc::TaskSpec& spec, const std::vector<internal::ArgView>& args,
      const std::vector<std::shared_ptr<internal::Buffer>>& owners) = 0;
};

// Thrown through user code by ray::ExitActor(); deliberately not a std::exception.
struct ExitActorSignal {};

}  // namespace torus::core
