// The cluster view the head ships to nodes with their heartbeats (Head's members; THREADS in
// head/head.h): the change log behind deltas, the shared whole-view snapshot, the
// --view-records-per-s budget and the heartbeat pacing; and the placement view of the alive
// nodes. Every function here runs with mu_ held.
#include <algorithm>

#include "head/head.h"

namespace torus {

namespace {
using Clock = std::chrono::steady_clock;
}  // namespace

void Head::BumpView(const std::string* node) {
  ++view_version_;
  view_log_.emplace_back(view_version_, node);
  // Deltas are given only to nodes at most max(64, N/2) versions behind (FillViewLocked): the
  // log keeps that many (at least 4096); a node further behind gets the whole view.
  size_t cap = std::max<size_t>(4096, nodes_.size() / 2 + 1);
  while (view_log_.size() > cap) {
    view_log_floor_ = view_log_.front().first;
    view_log_.pop_front();
  }
  while (!forgotten_ids_.empty() && forgotten_ids_.front().first < view_log_floor_) {
    forgotten_ids_.pop_front();
  }
}

void Head::ForgetDeadNodesLocked() {
  const size_t keep = static_cast<size_t>(std::max(cfg_.keep_dead_nodes, 0));
  while (nodes_.size() - alive_nodes_ > keep && !dead_order_.empty()) {
    std::string id = std::move(dead_order_.front());
    dead_order_.pop_front();
    auto it = nodes_.find(id);
    if (it == nodes_.end() || it->second.alive) continue;  // came back (it dies again later)
    // The view log names changed nodes by pointers to their keys: those of this node now point
    // to a copy of its id that lives as long as the log may hold them, so that a node behind
    // still learns from its delta that this one is gone.
    const std::string* key = &it->first;
    const std::string* copy = nullptr;
    for (auto& entry : view_log_) {
      if (entry.second != key) continue;
      if (!copy) {
        forgotten_ids_.emplace_back(view_version_, id);
        copy = &forgotten_ids_.back().second;
      }
      entry.second = copy;
    }
    nodes_.erase(it);
  }
  SweepTotals(names_, nodes_, &totals_live_);  // totals of shapes no node has any more
}

void Head::FillViewLocked(uint64_t version, rpc::HeartbeatReply* reply) {
  reply->set_view_version(view_version_);
  if (version == view_version_) return;
  // One budget of view records per second (--view-records-per-s) paces all view shipping
  // except small deltas, so that thousands of nodes coming up at once cannot turn heartbeats
  // into an O(N^2) flood. A node refused now keeps its version and asks on its next beat.
  auto now = Clock::now();
  double rate = std::max(1, cfg_.view_records_per_s);
  double cap = std::max(rate, static_cast<double>(alive_nodes_));
  view_tokens_ = std::min(cap, view_tokens_ + rate * std::chrono::duration<double>(now - view_refill_).count());
  view_refill_ = now;
  constexpr uint64_t kFreeDelta = 64;
  // A delta when the log covers every change after `version` and there are at most half as
  // many changes as nodes. The log holds one entry per version, so this test is O(1).
  uint64_t behind = view_version_ - version;
  if (version >= view_log_floor_ && version < view_version_ && !view_log_.empty() &&
      (behind <= kFreeDelta || behind <= nodes_.size() / 2)) {
    if (behind > kFreeDelta && view_tokens_ < static_cast<double>(behind)) {
      reply->set_view_version(version);
      return;
    }
    size_t from = static_cast<size_t>(version + 1 - view_log_.front().first);
    std::vector<const std::string*> changed;
    changed.reserve(behind);
    for (size_t i = from; i < view_log_.size(); ++i) {
      if (view_log_[i].second) changed.push_back(view_log_[i].second);
    }
    std::sort(changed.begin(), changed.end());
    changed.erase(std::unique(changed.begin(), changed.end()), changed.end());
    if (behind > kFreeDelta) view_tokens_ -= static_cast<double>(changed.size());
    reply->set_view_delta(true);
    for (const std::string* id : changed) {
      auto it = nodes_.find(*id);
      if (it == nodes_.end() || !it->second.alive) {
        reply->add_removed_node_ids(*id);
      } else {
        FillRecord(names_, it->first, it->second, /*full=*/false, reply->add_nodes());
      }
    }
    return;
  }
  // The whole view.
  if (view_tokens_ < static_cast<double>(alive_nodes_)) {
    reply->set_view_version(version);
    return;
  }
  // One serialization of the whole view serves every node that needs it: rebuilt when the view
  // changed, at most once a second while the log still covers the snapshot's version (its
  // receivers then catch up by deltas).
  bool stale = snapshot_version_ != view_version_;
  bool usable = snapshot_version_ >= view_log_floor_ && snapshot_version_ > 0;
  if (stale && (!usable || now - snapshot_built_ >= std::chrono::seconds(1))) {
    rpc::ListReply view;
    for (const auto& [id, n] : nodes_) {
      if (n.alive) FillRecord(names_, id, n, /*full=*/false, view.add_nodes());
    }
    view.SerializeToString(&snapshot_);
    snapshot_version_ = view_version_;
    snapshot_nodes_ = alive_nodes_;
    snapshot_built_ = now;
  }
  if (version == snapshot_version_) {  // nothing newer to give than what it has
    reply->set_view_version(version);
    return;
  }
  view_tokens_ -= static_cast<double>(snapshot_nodes_);
  reply->set_view_version(snapshot_version_);
  reply->set_view_snapshot(snapshot_);
}

uint32_t Head::PacedHeartbeatMsLocked() const {
  if (cfg_.max_heartbeats_per_s <= 0) return 0;
  return static_cast<uint32_t>((alive_nodes_ * 1000 + cfg_.max_heartbeats_per_s - 1) /
                               static_cast<size_t>(cfg_.max_heartbeats_per_s));
}

std::vector<NodeView> Head::ViewOfNodes(std::map<std::string, int>* index_of, bool with_labels) {
  std::vector<NodeView> view;
  view.reserve(alive_nodes_);
  for (const auto& [nid, n] : nodes_) {
    if (!n.alive) continue;
    (*index_of)[nid] = static_cast<int>(view.size());
    view.push_back({nid, ToResourceMap(names_, *n.total), ToResourceMap(names_, n.Available()),
                    with_labels ? LabelsOf(names_, nid, n) : std::map<std::string, std::string>()});
  }
  return view;
}

}  // namespace torus
