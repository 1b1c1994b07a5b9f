// InfeasibleWarning, and CoreWorker::WarnInfeasible (a task's lease request the node answered
// with LeaseReply.infeasible).
#include "core/infeasible_warning.h"

#include "common/logging.h"
#include "common/resources.h"
#include "core/core_worker.h"

namespace torus::core {

std::string InfeasibleWarning(std::string_view what, const rpc::ResourceSet& resources) {
  const bool actor = what.rfind("actor", 0) == 0;
  return "The " + std::string(what) + " cannot be scheduled right now. It requires " +
         ResourcesToString(FromProto(resources)) +
         " for placement, however the cluster currently cannot provide the requested resources. "
         "The required resources may be added as autoscaling takes place or placement groups are "
         "scheduled. Otherwise, consider reducing the resource requirements of the " +
         (actor ? "actor." : "task.") + " It stays pending until a node with these resources joins.";
}

void CoreWorker::WarnInfeasible(rpc::LeaseRequest& req) {
  req.set_report_infeasible(false);  // asked again, the node holds it until a node can run it
  std::string what = req.description();
  const ResourceMap res = FromProto(req.resources());  // sorted: protobuf maps have no order
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!infeasible_warned_.insert(req.description() + "|" + ResourcesToString(res)).second) return;
    // The user's name for the work and the id of one waiting task (its queue's first), as Ray
    // names the task; the description holds the wire name (a Python function's key).
    for (const auto& [key, q] : queues_) {
      if (q->tasks.empty() || q->lease_template.description() != req.description() ||
          FromProto(q->lease_template.resources()) != res) {
        continue;
      }
      const rpc::TaskSpec& spec = q->tasks.front()->spec;
      what = "task " + spec.name() + " (ID " + spec.task_id() + ")";
      break;
    }
  }
  TORUS_LOG(WARNING) << InfeasibleWarning(what, req.resources());
}

}  // namespace torus::core
