// BundleHandler: the node's side of placement groups (docs/placement_groups.md): the head's
// PrepareBundles (reserve a group's bundles here, all or none, optionally committed at once),
// CommitBundles and ReleaseBundles, over gRPC or the node's lane (docs/wire.md). The bundles
// themselves live in the Ledger; this part adds what changes with them: leases queued for a
// committed bundle may run, and the work running in (or queued for) a released bundle ends
// (workers SIGKILLed after the lock is released, with the release's reason as their end).
// Every reply carries the node's ledger after the call (Ledger::FillReply / AppendReply).
//
// THREADS: shares the node's mutex (NodeState::mu; node/node_state.h); called from gRPC
// handler threads and the lane's connection threads, each call under the lock once.
#pragma once

#include <sys/types.h>

#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "common/thread_annotations.h"
#include "node/leases.h"
#include "node/node_state.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

class BundleHandler {
 public:
  // `st`, `leases`, `labels` and `node_id` (the node's own) outlive this.
  BundleHandler(NodeState& st, LeaseScheduler& leases, const std::map<std::string, std::string>& labels,
                const std::string& node_id)
      : st_(st), leases_(leases), labels_(labels), node_id_(node_id) {}
  BundleHandler(const BundleHandler&) = delete;
  BundleHandler& operator=(const BundleHandler&) = delete;

  void Prepare(const rpc::BundlesRequest& req, rpc::PrepareBundlesReply* reply) EXCLUDES(st_.mu);
  // NOT_FOUND when the group has no prepared bundles here.
  grpc::Status Commit(const rpc::BundlesRequest& req, rpc::PrepareBundlesReply* reply) EXCLUDES(st_.mu);
  void Release(const rpc::BundlesRequest& req, rpc::PrepareBundlesReply* reply) EXCLUDES(st_.mu);
  // The lane's PrepareBundles (prepare) or ReleaseBundles: serialised request in, reply out.
  grpc::Status Lane(bool prepare, std::string_view in, std::string* out) EXCLUDES(st_.mu);
  // FAILED_PRECONDITION when the request is addressed to another node (BundlesRequest.node_id).
  grpc::Status CheckAddressee(const rpc::BundlesRequest& req) const;

 private:
  // Reserves (and with `commit`, commits) the request's bundles, all or none; false with
  // *error when they do not fit or a label selector does not match.
  bool PrepareLocked(const rpc::BundlesRequest& req, std::string* error) REQUIRES(st_.mu);
  // Releases the request's bundles (all of the group's when it names none) and ends the work
  // in them: the pids to SIGKILL once the lock is released are added to *to_kill.
  void ReleaseLocked(const rpc::BundlesRequest& req, std::vector<pid_t>* to_kill) REQUIRES(st_.mu);

  NodeState& st_;
  LeaseScheduler& leases_;
  const std::map<std::string, std::string>& labels_;
  const std::string& node_id_;
};

}  // namespace torus
