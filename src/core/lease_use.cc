#include "core/lease_use.h"

namespace torus {

void LeaseUse::StreamOpened() {
  std::lock_guard<std::mutex> lock(mu_);
  ++unnamed_streams_;
}

bool LeaseUse::Named(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (unnamed_streams_ > 0) --unnamed_streams_;
  if (revoked_.count(lease_id)) return false;
  ++in_use_[lease_id];
  return true;
}

void LeaseUse::StreamClosed(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (lease_id.empty()) {
    if (unnamed_streams_ > 0) --unnamed_streams_;
    return;
  }
  auto it = in_use_.find(lease_id);
  if (it != in_use_.end() && --it->second <= 0) in_use_.erase(it);
}

LeaseUse::Use LeaseUse::Check(const std::string& lease_id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (in_use_.count(lease_id)) return Use::kInUse;
  if (unnamed_streams_ > 0) return Use::kUndecided;
  if (revoked_.insert(lease_id).second) {
    revoked_order_.push_back(lease_id);
    if (revoked_order_.size() > kRevokedKept) {
      revoked_.erase(revoked_order_.front());
      revoked_order_.pop_front();
    }
  }
  return Use::kRevoked;
}

}  // namespace torus
