// CppExecutor: runs C++ functions, actor factories and actor methods registered with
// RAY_REMOTE (internal::FunctionRegistry) in this executable. See executor.h.
//
// THREADS: as Executor. The actor instance is written by the creation task only, before any
// method call can arrive (the actor's address is published once its constructor returned), and
// only read afterwards.
#pragma once

#include <string>

#include "core/executor.h"

namespace torus::core {

class CppExecutor final : public Executor {
 public:
  // `executable`: this worker's executable, named in "not registered" errors.
  explicit CppExecutor(std::string executable) : executable_(std::move(executable)) {}
  StatusOr<TaskOutput> Invoke(const rpc::TaskSpec& spec,
                              const std::vector<internal::ArgView>& args,
                              const std::vector<std::shared_ptr<internal::Buffer>>& owners) override;

 private:
  const std::string executable_;
  internal::ActorInstance actor_;  // set by the creation task
};

}  // namespace torus::core
