#include "core/cpp_executor.h"

namespace torus::core {

namespace {
const std::string& NilBytes() {
  static const std::string nil("\xc0", 1);  // msgpack nil
  return nil;
}
}  // namespace

StatusOr<TaskOutput> CppExecutor::Invoke(const rpc::TaskSpec& spec,
                                         const std::vector<internal::ArgView>& args,
                                         const std::vector<std::shared_ptr<internal::Buffer>>&) {
  const auto& registry = internal::FunctionRegistry::Instance();
  if (spec.num_returns() > 1) {
    return InvalidArgument("C++ function '" + spec.function() + "' returns one object, not " +
                           std::to_string(spec.num_returns()) + " (num_returns)");
  }
  if (spec.actor_creation()) {
    const auto* f = registry.FindFactory(spec.function());
    if (!f) {
      return NotFound("actor factory '" + spec.function() +
                      "' is not registered in worker executable " + executable_ +
                      " (missing RAY_REMOTE?)");
    }
    actor_ = (*f)(args);
    return TaskOutput::One(NilBytes());
  }
  if (!spec.actor_id().empty()) {
    const auto* m = registry.FindMethod(spec.function());
    if (!m) {
      return NotFound("actor method '" + spec.function() +
                      "' is not registered in worker executable " + executable_);
    }
    return TaskOutput::One((*m)(actor_.ptr, args));
  }
  const auto* f = registry.FindFunction(spec.function());
  if (!f) {
    return NotFound("function '" + spec.function() + "' is not registered in worker executable " +
                    executable_ + " (missing RAY_REMOTE?)");
  }
  return TaskOutput::One((*f)(args));
}

}  // namespace torus::core
