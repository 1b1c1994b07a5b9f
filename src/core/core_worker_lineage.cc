// CoreWorker's lost objects (docs/objects.md "Lost objects"): the lineage an owner keeps of the
// normal tasks that made its objects, rebuilding a value whose only copy went with its node by
// running that task again (its lost arguments first), and the reactions of a reader, a borrower
// and an executor that find a copy gone.

#include <chrono>
#include <functional>
#include <optional>
#include <thread>

#include "common/ids.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "core/core_worker.h"
#include "core/task_record.h"
#include "torus/api/exceptions.h"

namespace torus::core {

namespace {
using Clock = std::chrono::steady_clock;

// The objects `spec` takes as arguments (direct refs and refs inside by-value arguments), as
// SubmitTask pinned them.
std::vector<std::string> ArgRefs(const rpc::TaskSpec& spec) {
  std::vector<std::string> refs;
  for (const auto& a : spec.args()) {
    for (const auto& n : a.nested_ids()) refs.push_back(n);
    if (a.is_ref()) refs.push_back(a.ref_id());
  }
  return refs;
}

// A value stored on a node that is gone (NodeLiveness) is lost, unless this process
// pulled a copy of it (PromoteLocalCopy).
bool LostWith(const ObjectEntry& e, const NodeLiveness& nodes) {
  return e.ready && !e.is_error && e.in_shm && !e.has_local_copy && nodes.Gone(e.shm.node_id());
}

// The copy this process pulled into its own node's store becomes the value's location when the
// node of the first copy is gone (then every reader is sent to it). Whether it did.
bool PromoteLocalCopy(ObjectEntry& e, const NodeLiveness& nodes) {
  if (!e.ready || e.is_error || !e.in_shm || !e.has_local_copy || !nodes.Gone(e.shm.node_id())) {
    return false;
  }
  e.shm = std::move(e.local_copy);
  e.local_copy.Clear();
  e.has_local_copy = false;
  return true;
}
}  // namespace

void CoreWorker::KeepLineage(const std::shared_ptr<TaskRecord>& t) {
  if (t->cancelled || !t->actor_id.empty() || t->spec.attempt() >= t->max_retries) return;
  std::vector<std::string> args;
  for (const auto& a : t->spec.args()) {
    if (a.is_ref() && OwnerOf(a.ref_id()) == address_) args.push_back(a.ref_id());
  }
  const size_t bytes = sizeof(TaskRecord) + t->arena.SpaceAllocated();
  const int n = std::max(t->spec.num_returns(), 1);
  for (int i = 0; i < n; ++i) {
    if (!refs_.SetLineage(ReturnIdOf(t->spec.return_id(), i), t, args, bytes)) continue;
  }
}

void CoreWorker::ResetValue(ObjectEntry& e) {
  e.ready = false;
  e.is_error = false;
  e.error.Clear();
  e.in_shm = false;
  e.shm.Clear();
  e.inline_data.reset();
}

std::string CoreWorker::Rebuild(const std::string& id, const NodeLiveness& nodes,
                                const std::string& cause) {
  ObjectEntry* e = refs_.Find(id);
  if (!e || !e->owned) return "it was freed";
  if (e->rebuilding) return "";
  if (!e->lineage) {
    return "nothing can make it again (it was put, is an actor call's result, its task had no "
           "retries left, or lineage past the budget of " +
           std::to_string(refs_.lineage_bytes() >> 20) + " MiB was not kept)";
  }
  std::shared_ptr<TaskRecord> made_by = e->lineage->task;
  const rpc::TaskSpec& spec = made_by->spec;
  if (spec.attempt() >= made_by->max_retries) {
    return "task " + spec.function() + " already ran " + std::to_string(spec.attempt() + 1) +
           " time(s) (max_retries " + std::to_string(made_by->max_retries) + ")";
  }
  // Arguments first: ours that were evicted, or are lost too, are made again before the task.
  for (const auto& a : spec.args()) {
    if (!a.is_ref() || OwnerOf(a.ref_id()) != address_) continue;
    ObjectEntry* ae = refs_.Find(a.ref_id());
    if (!ae) return "its argument " + a.ref_id() + " was freed";
    PromoteLocalCopy(*ae, nodes);
    if (!ae->evicted && !LostWith(*ae, nodes)) continue;
    std::string why = Rebuild(a.ref_id(), nodes, "an argument of " + spec.function());
    if (!why.empty()) return "its argument " + a.ref_id() + " cannot be rebuilt: " + why;
  }
  TORUS_LOG(INFO) << "rebuilding object " << id << ": running task " << spec.function()
                  << " again (" << AttemptText(spec.attempt() + 2, made_by->max_retries)
                  << ") because " << cause;
  const int n = std::max(spec.num_returns(), 1);
  for (int i = 0; i < n; ++i) {
    ObjectEntry* r = refs_.Find(ReturnIdOf(spec.return_id(), i));
    if (!r) continue;
    ResetValue(*r);
    refs_.Unevict(*r);
    r->rebuilding = true;
  }
  auto again = NextAttempt(*made_by);
  again->pinned.clear();
  again->cancelled = false;
  Requeue(std::move(again), /*pin=*/true);
  return "";
}

void CoreWorker::Requeue(std::shared_ptr<TaskRecord> again, bool pin) {
  for (auto& a : *again->spec.mutable_args()) {
    if (!a.is_ref()) continue;
    a.clear_location();
    a.set_location_known(false);
  }
  again->missing = 0;
  if (pin) {
    TrackArgs(again, ArgRefs(again->spec));
  } else {
    WaitForArgs(again);
  }
  if (again->missing > 0) {
    SetTaskState(again->spec, rpc::TaskInfo::PENDING_ARGS);
    return;
  }
  FillResolvedArgs(*again);
  Enqueue(std::move(again));
}

NodeLiveness CoreWorker::LiveNodes() {
  NodeLiveness nodes;
  rpc::ListReply cluster;
  try {
    cluster = head_->ListCluster();
  } catch (const internal::RayException& e) {
    TORUS_LOG(WARNING) << "cannot ask the head which nodes are alive: " << e.what();
    nodes.known = false;
    return nodes;
  }
  nodes.settling = cluster.settling();
  for (const auto& n : cluster.nodes()) (n.alive() ? nodes.alive : nodes.dead).insert(n.node_id());
  return nodes;
}

bool CoreWorker::RecoverLost(const std::vector<LostRead>& lost) {
  const NodeLiveness nodes = LiveNodes();
  bool waiting_for_death = false;
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (const auto& l : lost) {
    if (!nodes.Gone(l.loc.node_id())) {
      // Unreadable, but its node is not known gone (yet): wait for that, for so long.
      auto since = unreadable_since_.try_emplace(l.id, now).first->second;
      if (now - since > std::chrono::milliseconds(kNodeDeathWaitMs)) {
        unreadable_since_.erase(l.id);
        throw internal::UnreconstructableException(
            l.message + " (for " + std::to_string(kNodeDeathWaitMs / 1000) +
            " s, while node " + l.loc.node_id() + " was not declared dead)");
      }
      waiting_for_death = true;
      continue;
    }
    unreadable_since_.erase(l.id);
    ObjectEntry* e = refs_.Find(l.id);
    if (!e || !e->ready || e->rebuilding || e->fetching) continue;  // already on its way again
    if (!e->in_shm || e->shm.key() != l.loc.key()) continue;  // stored again since: read again
    if (PromoteLocalCopy(*e, nodes)) continue;                  // read our own copy instead
    const std::string cause = "its copy on node " + l.loc.node_id() + " (" + l.loc.node_address() +
                              ") is gone with the node";
    if (e->owned) {
      RebuildOrFail(l.id, nodes, cause);
    } else {
      // Borrowed: its owner rebuilds it (or says why not) before it answers.
      ResetValue(*e);
      e->fetching = true;
      SpawnTracked([this, id = l.id, key = l.loc.key()] { FetchFromOwner(id, /*lost=*/true, key); });
    }
  }
  return !waiting_for_death;
}

void CoreWorker::RebuildOrFail(const std::string& id, const NodeLiveness& nodes,
                               const std::string& cause) {
  std::string why = Rebuild(id, nodes, cause);
  if (why.empty()) return;
  if (ObjectEntry* e = refs_.Find(id)) ResetValue(*e);
  FailObject(id, StatusCode::kObjectLost,
             "object " + id + " is lost: " + cause + ", and it cannot be rebuilt: " + why);
}

bool CoreWorker::PollNodeDeath(const std::function<bool(const NodeLiveness& nodes)>& step) {
  const auto give_up = Clock::now() + std::chrono::milliseconds(kNodeDeathWaitMs);
  for (;;) {
    const NodeLiveness nodes = LiveNodes();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (shutting_down_ || step(nodes)) return true;
    }
    if (Clock::now() >= give_up) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

void CoreWorker::RebuildForBorrower(const std::string& id, const std::string& lost_key) {
  rpc::ObjectLocation loc;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ObjectEntry* e = refs_.Find(id);
    if (!e || !e->owned || !e->ready || e->is_error || !e->in_shm) return;
    // The borrower could not read an older copy (this one was made again since, elsewhere): it
    // reads this one. Waiting for this copy's node to die would hang it.
    if (!lost_key.empty() && e->shm.key() != lost_key) return;
    loc = e->shm;
  }
  PollNodeDeath([&](const NodeLiveness& nodes) {
    if (!nodes.known) return true;  // the borrower reads the old location again and tells us again
    ObjectEntry* e = refs_.Find(id);
    if (!e || !e->ready || !e->in_shm || e->shm.key() != loc.key()) return true;  // changed
    if (!nodes.Gone(loc.node_id())) return false;
    if (PromoteLocalCopy(*e, nodes)) return true;  // the borrower is sent to our copy
    RebuildOrFail(id, nodes,
                  "a borrower cannot read its copy on node " + loc.node_id() + " (" +
                      loc.node_address() + "), which is gone");
    return true;
  });
}

void CoreWorker::RetryAfterLostArg(std::shared_ptr<TaskRecord> t, std::string lost_id,
                                   rpc::Error error) {
  // Requires mu_.
  auto fail = [&](const std::string& why) {
    FailTask(*t, StatusCode::kObjectLost, error.message() + (why.empty() ? "" : "; " + why));
    cv_.notify_all();
    return true;
  };
  std::string failed_key;  // the copy the task could not read
  for (const auto& a : t->spec.args()) {
    if (a.is_ref() && a.ref_id() == lost_id && a.location().in_shm()) failed_key = a.location().key();
  }
  const bool done = PollNodeDeath([&](const NodeLiveness& nodes) {
    ObjectEntry* e = refs_.Find(lost_id);
    if (!e) return fail("the argument was freed");
    bool go = !e->ready || e->rebuilding;  // on its way again already
    if (!go && PromoteLocalCopy(*e, nodes)) go = true;  // the task reads our copy
    if (!go && LostWith(*e, nodes)) {
      std::string why = Rebuild(lost_id, nodes, "task " + t->spec.function() + " could not read it");
      if (!why.empty()) return fail("it cannot be rebuilt: " + why);
      go = true;
    }
    // Stored again meanwhile (a value whose copy is still on a live node waits for that node's
    // death to be declared, or for PollNodeDeath to give up).
    if (!go && e->ready &&
        (e->is_error || !e->in_shm || (!failed_key.empty() && e->shm.key() != failed_key))) {
      go = true;
    }
    if (!go) return false;
    TORUS_LOG(INFO) << "running task " << t->spec.function() << " again: its argument " << lost_id
                    << " was lost and is made again";
    auto again = NextAttempt(*t);  // the pins go with it
    t->pinned.clear();
    Requeue(std::move(again), /*pin=*/false);
    return true;
  });
  if (done) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (!shutting_down_) fail("its node was not declared dead");
}

}  // namespace torus::core
