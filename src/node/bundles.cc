#include "node/bundles.h"

#include <signal.h>

namespace torus {

namespace {
std::vector<int> BundleIndices(const rpc::BundlesRequest& req) {
  std::vector<int> out;
  for (const auto& b : req.bundles()) out.push_back(b.index());
  return out;
}
}  // namespace

grpc::Status BundleHandler::Lane(bool prepare, std::string_view in, std::string* out) {
  // The same work as the service methods, with the request kept per thread and the reply
  // written straight from the ledger (a reservation of 64 hosts is 128 of these calls, one per
  // node process, on a machine with few cores).
  thread_local rpc::BundlesRequest req;
  struct Clear {
    ~Clear() { req.Clear(); }
  } clear;
  if (!req.ParseFromArray(in.data(), static_cast<int>(in.size()))) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        std::string("the ") + (prepare ? "PrepareBundles" : "ReleaseBundles") +
                            " request is not a valid message");
  }
  if (auto s = CheckAddressee(req); !s.ok()) return s;
  std::string error;
  if (prepare) {
    MutexLock lock(st_.mu);
    bool ok = PrepareLocked(req, &error);
    st_.ledger.AppendReply(ok, error, out);
    return grpc::Status::OK;
  }
  std::vector<pid_t> to_kill;
  {
    MutexLock lock(st_.mu);
    ReleaseLocked(req, &to_kill);
    st_.ledger.AppendReply(true, error, out);
  }
  for (pid_t p : to_kill) kill(p, SIGKILL);
  return grpc::Status::OK;
}

grpc::Status BundleHandler::CheckAddressee(const rpc::BundlesRequest& req) const {
  if (req.node_id().empty() || req.node_id() == node_id_) return grpc::Status::OK;
  return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                      "bundles of placement group " + req.pg_id() + " are for node " + req.node_id() +
                          "; this is node " + node_id_);
}

void BundleHandler::Prepare(const rpc::BundlesRequest& req, rpc::PrepareBundlesReply* reply) {
  MutexLock lock(st_.mu);
  std::string error;
  bool ok = PrepareLocked(req, &error);
  reply->set_ok(ok);
  reply->set_error(error);
  st_.ledger.FillReply(reply);
}

bool BundleHandler::PrepareLocked(const rpc::BundlesRequest& req, std::string* error) {
  if (!st_.ledger.Prepare(req.pg_id(), Ledger::Specs(req), req.commit(), labels_, error)) return false;
  if (req.commit()) {
    leases_.AssertHeld();  // NodeState::mu
    leases_.ScheduleLocked();
  }
  return true;
}

grpc::Status BundleHandler::Commit(const rpc::BundlesRequest& req, rpc::PrepareBundlesReply* reply) {
  MutexLock lock(st_.mu);
  reply->set_ok(true);
  st_.ledger.FillReply(reply);
  if (!st_.ledger.Commit(req.pg_id(), BundleIndices(req))) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "no prepared bundles of " + req.pg_id());
  }
  leases_.AssertHeld();  // NodeState::mu
  leases_.ScheduleLocked();
  return grpc::Status::OK;
}

void BundleHandler::Release(const rpc::BundlesRequest& req, rpc::PrepareBundlesReply* reply) {
  std::vector<pid_t> to_kill;
  reply->set_ok(true);
  {
    MutexLock lock(st_.mu);
    ReleaseLocked(req, &to_kill);
    st_.ledger.FillReply(reply);
  }
  for (pid_t p : to_kill) kill(p, SIGKILL);
}

void BundleHandler::ReleaseLocked(const rpc::BundlesRequest& req, std::vector<pid_t>* to_kill) {
  std::vector<int> released = st_.ledger.Release(req.pg_id(), BundleIndices(req));
  // Work running in a released bundle ends with it; its resources came back with the bundle's.
  for (int index : released) {
    for (auto& [id, w] : st_.pool.workers()) {
      if (w->hold.pg_id == req.pg_id() && w->hold.bundle == index) {
        w->kill_requested = true;
        w->end_reason = req.reason();
        w->hold.res.clear();
        w->hold.pg_id.clear();
        if (w->pid > 0) to_kill->push_back(w->pid);
      }
    }
  }
  leases_.AssertHeld();  // NodeState::mu
  // Pending leases for the removed group fail now rather than wait forever.
  if (!st_.ledger.HasGroup(req.pg_id())) leases_.FailGroupLocked(req.pg_id());
  leases_.ScheduleLocked();
  st_.cv.NotifyAll();
}

}  // namespace torus
