// The cluster's recent tasks and actor calls as Chrome trace events (`torus timeline`,
// `ray.timeline()`; docs/observability.md), which Perfetto and chrome://tracing open.
//
// CONTRACT
// - GatherTasks asks every submitter the cluster knows for its task table (CoreWorker.ListTasks):
//   each job's driver and every registered worker of every live node (tasks submitted from inside
//   tasks). Submitters that do not answer within the deadline are skipped; each task appears once.
//   A submitter keeps its last 10,000 finished tasks, so "recent" means that.
// - TimelineEvents turns tasks into events: one complete event ("ph": "X") per task that ran, on
//   the row of its worker ("tid") inside the row group of its node ("pid"); times are the
//   executor's wall clock in µs. Process and thread name metadata events ("ph": "M") name the
//   rows "Node <id> (<hostname>)" and "Worker <id>". A task still running ends at `now_us`.
//   Tasks that never reached a worker are left out.
//
// THREADS: GatherTasks blocks its caller (it runs its calls on up to 16 threads of its own);
// TimelineEvents is pure.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "proto/torus.pb.h"

namespace torus::core {

std::vector<rpc::TaskInfo> GatherTasks(const rpc::ListReply& cluster, const std::string& token,
                                       int deadline_ms = 3000);

nlohmann::json TimelineEvents(const std::vector<rpc::TaskInfo>& tasks, const rpc::ListReply& cluster,
                              int64_t now_us);

}  // namespace torus::core
