// The warning a driver prints when work it submitted fits no node of the cluster: the work stays
// pending as infeasible demand (until a node with the resources joins, or it is cancelled), as
// in Ray, whose words the warning keeps so that what users search for still matches. Nodes
// detect it (LeaseRequest.report_infeasible, node/leases.cc) and so does the head for actors
// (CreateActorReply.warning, head/actors.cc).
#pragma once

#include <string>
#include <string_view>

#include "proto/torus.pb.h"

namespace torus::core {

// `what`: "task f" or "actor A (ID ...)"; `resources`: what it asks for.
// Pure function, thread-safe.
std::string InfeasibleWarning(std::string_view what, const rpc::ResourceSet& resources);

}  // namespace torus::core
