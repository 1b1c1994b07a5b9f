// NodeState: what the node's parts change together under one lock: the resource ledger
// (node/ledger.h) and the worker pool (node/worker_pool.h). A task lease (node/leases.h), an
// actor (node/actor_start.h), a placement-group bundle (node/bundles.h) and a worker's exit (the
// node's reaper) all draw on the same resources and the same workers, so one mutex keeps each
// of those changes atomic with respect to the others.
//
// The Node owns it; each part holds a reference (the Node outlives its parts). A part's method
// marked REQUIRES(st_.mu) is called with `mu` held: a caller holding the lock through another
// expression first calls the part's AssertHeld() (the lock is the same object; clang's analysis
// cannot see that through two references).
//
// THREADS: `ledger` and `pool` are guarded by `mu`; `cv` wakes waiters on grants, worker
// registrations and exits, and on Stop; `reaper_waiter` and `stopping` are thread-safe.
#pragma once

#include <atomic>
#include <string>
#include <utility>

#include "common/process.h"
#include "common/resources.h"
#include "common/thread_annotations.h"
#include "node/ledger.h"
#include "node/worker_pool.h"

namespace torus {

struct NodeState {
  NodeState(std::string node_id, ResourceMap total) : ledger(std::move(node_id), std::move(total)) {}
  NodeState(const NodeState&) = delete;
  NodeState& operator=(const NodeState&) = delete;

  Mutex mu;
  CondVar cv;  // grants, worker registrations and exits, Stop
  Ledger ledger GUARDED_BY(mu);
  ChildExitWaiter reaper_waiter;  // the reaper sleeps here until a worker exits or starts
  WorkerPool pool GUARDED_BY(mu){&reaper_waiter};
  std::atomic<bool> stopping{false};  // set once by Node::Stop
};

}  // namespace torus
