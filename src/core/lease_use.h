// LeaseUse: a worker's record of which leases its open task streams carry, so that its node can
// ask whether a lease it granted is in use (CoreWorker.CheckLease) and take back one whose grant
// never reached its holder.
//
// A holder opens a task stream to the leased worker and names its lease in the first batch. The
// node, for a lease granted a while ago and not yet known to be in use, asks the worker:
//  - IN_USE: a stream names it; the worker returns the lease when that stream ends.
//  - UNDECIDED: some open stream has not named its lease yet; ask again later.
//  - REVOKED: nothing names it; the lease is revoked here, atomically with the answer, so a
//    stream that names it later is refused (Named() returns false) and the node may reuse the
//    worker at once.
//
// THREADS: every method may be called from any thread; one internal mutex, never held while
// calling out.
#pragma once

#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

namespace torus {

class LeaseUse {
 public:
  enum class Use { kInUse, kRevoked, kUndecided };

  // How many revoked lease ids are remembered (oldest forgotten first).
  static constexpr size_t kRevokedKept = 4096;

  // A task stream opened; it has not named a lease yet.
  void StreamOpened();
  // The stream opened last named `lease_id` (its first batch). False: that lease was revoked and
  // the stream must be refused; the stream then counts as closed.
  bool Named(const std::string& lease_id);
  // A stream ended; `lease_id` is what it named ("" if nothing, or if Named() refused it).
  void StreamClosed(const std::string& lease_id);
  // The node's question about `lease_id` (see above).
  Use Check(const std::string& lease_id);

 private:
  std::mutex mu_;
  int unnamed_streams_ = 0;                         // guarded by mu_
  std::unordered_map<std::string, int> in_use_;     // guarded by mu_: lease id -> open streams
  std::unordered_set<std::string> revoked_;         // guarded by mu_
  std::deque<std::string> revoked_order_;           // guarded by mu_
};

}  // namespace torus
