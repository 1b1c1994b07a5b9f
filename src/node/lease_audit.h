// LeaseAudit: takes back leases whose grant never reached their holder (the grant's reply was
// lost: the requester gave up, timed out or exited at that moment). Every 500 ms it asks the
// node which leases were granted more than TORUS_LEASE_CHECK_MS (default 3000) ago and are not
// yet known to be in use, asks each such worker CoreWorker.CheckLease (1 s deadline), and tells
// the node what the worker said (IN_USE: stop asking; REVOKED: take the lease back). A worker
// that does not answer is asked again next round (a dead one is the reaper's).
//
// THREADS: owns one thread (a PeriodicThread), stopped and joined by Stop() or the destructor.
// The hooks run on that thread with no lock of the audit held; they take the node's lock
// themselves. The RPCs run without any lock. No state of its own beyond its constants.
#pragma once

#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "common/periodic_thread.h"
#include "proto/torus.grpc.pb.h"

namespace torus {

class LeaseAudit {
 public:
  struct Question {
    std::string worker_id, address, lease_id;
  };
  struct Hooks {
    // The leases to ask about this round (granted at least check_age() ago, not seen in use).
    std::function<std::vector<Question>(std::chrono::milliseconds check_age)> due;
    // The worker's answer about q's lease (IN_USE or REVOKED).
    std::function<void(const Question& q, rpc::CheckLeaseReply::Use use)> answered;
  };

  // check_age: TORUS_LEASE_CHECK_MS (a positive number of ms), else 3000 ms.
  LeaseAudit(std::string token, Hooks hooks);
  ~LeaseAudit() { Stop(); }
  LeaseAudit(const LeaseAudit&) = delete;
  LeaseAudit& operator=(const LeaseAudit&) = delete;

  void Start();
  void Stop() { thread_.Stop(); }
  std::chrono::milliseconds check_age() const { return check_age_; }

 private:
  void Round();

  // constant after construction
  const std::string token_;
  const Hooks hooks_;
  std::chrono::milliseconds check_age_{3000};
  PeriodicThread thread_;
};

}  // namespace torus
