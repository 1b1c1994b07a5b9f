// PlacementGroupManager (placement_groups.h): its durable state (each group's record in the
// head's store, restored by a resumed head) and the reconciliation of the records with the
// bundles the nodes actually hold when they register (docs/fault_tolerance.md, "Reconciling
// bundles"). Every function here runs with mu_ held.
#include <set>

#include "common/logging.h"
#include "common/resources.h"
#include "head/placement_groups.h"

namespace torus {

// ------------------------------------------------------------------------------- durable state

void PlacementGroupManager::SaveLocked(const PgEntry& e) {
  if (!store_) return;
  const std::string& id = e.rec.pg_id();
  Status s = e.rec.state() == rpc::PlacementGroupRecord::REMOVED
                 ? store_->Delete(StoreKind::kPlacementGroup, id)
                 : store_->Put(StoreKind::kPlacementGroup, id, e.rec.SerializeAsString());
  if (!s.ok()) TORUS_LOG(ERROR) << "placement group " << id << " not saved: " << s.message();
}

StatusOr<size_t> PlacementGroupManager::RestoreLocked(const std::vector<std::pair<std::string, std::string>>& records) {
  std::vector<PgEntry> parsed;
  for (const auto& [id, bytes] : records) {
    rpc::PlacementGroupRecord rec;
    if (!rec.ParseFromString(bytes) || rec.pg_id() != id) {
      return Internal("the record of placement group " + id + " is garbled");
    }
    // The selectors and the slice shape parsed as at creation; the record itself as saved.
    auto e = ParsePgRequest(rec, Clock::now());
    if (!e.ok()) return Internal("placement group " + id + ": " + e.status().message());
    e->rec = std::move(rec);
    e->pending_since = Clock::now();
    parsed.push_back(std::move(*e));
  }
  for (auto& e : parsed) {
    const std::string id = e.rec.pg_id();
    if (e.rec.state() == rpc::PlacementGroupRecord::REMOVED) continue;  // its deletion did not reach the store
    // A grant in flight when the head died: what the nodes may have reserved for it is
    // released before the group is placed again.
    std::vector<NodeCall> undo;
    for (const auto& g : e.rec.granting()) {
      // No node id kept: whichever node is at the address releases (its ledger: next heartbeat).
      undo.push_back({"", g.node_address(), ReleasePayload(id, {g.indexes().begin(), g.indexes().end()},
                                                      "the head restarted while reserving them")});
    }
    e.rec.clear_granting();
    DropUngrantedSlicesLocked(e);
    const bool waiting = e.rec.state() == rpc::PlacementGroupRecord::PENDING ||
                         e.rec.state() == rpc::PlacementGroupRecord::RESCHEDULING;
    if (waiting && undo.empty()) queue_.push_back(id);
    if (waiting && !undo.empty()) {
      (void)pool_.Post([this, id, undo = std::move(undo)] {
        ReleaseOnNodes(undo);
        MutexLock lock(mu_);
        auto it = pgs_.find(id);
        if (it == pgs_.end() || (it->second.rec.state() != rpc::PlacementGroupRecord::PENDING &&
                                 it->second.rec.state() != rpc::PlacementGroupRecord::RESCHEDULING)) {
          return;
        }
        SaveLocked(it->second);
        queue_.push_back(id);
        sched_cv_.NotifyAll();
      });
    }
    if (!e.rec.name().empty()) named_[{e.rec.ray_namespace(), e.rec.name()}] = id;
    for (const auto& name : e.rec.slice_names()) {
      if (!name.empty()) slice_holder_[name] = id;
    }
    pgs_[id] = std::move(e);
  }
  if (!queue_.empty()) sched_cv_.NotifyAll();
  return parsed.size();
}

std::set<std::string> PlacementGroupManager::NodesInUseLocked() const {
  std::set<std::string> out;
  for (const auto& [id, e] : pgs_) {
    if (e.rec.state() == rpc::PlacementGroupRecord::REMOVED) continue;
    for (const auto& b : e.rec.bundles()) {
      if (!b.node_id().empty()) out.insert(b.node_id());
    }
  }
  return out;
}

// ------------------------------------------------------------------------------- reconciliation

bool PlacementGroupManager::RecordedOnLocked(const std::string& pg_id, int index, const std::string& node_id) const {
  auto it = pgs_.find(pg_id);
  if (it == pgs_.end() || it->second.rec.state() == rpc::PlacementGroupRecord::REMOVED) return false;
  const auto& bundles = it->second.rec.bundles();
  return index >= 0 && index < bundles.size() && bundles[index].node_id() == node_id;
}

void PlacementGroupManager::ReconcileNodeLocked(const std::string& node_id, const std::string& node_address,
                                                const google::protobuf::RepeatedPtrField<rpc::HeldBundles>& held,
                                                bool held_is_stale) {
  std::map<std::string, std::set<int>> holds;
  for (const auto& h : held) holds[h.pg_id()].insert(h.indexes().begin(), h.indexes().end());
  // Recorded here, not held: the group lost them (as on the node's death, for those bundles).
  if (!held_is_stale) {
    LoseBundlesLocked(node_id, [&](const PgEntry& e, int index) {
      auto h = holds.find(e.rec.pg_id());
      bool missing = h == holds.end() || !h->second.count(index);
      if (missing) {
        TORUS_LOG(WARNING) << "node " << node_id << " does not hold bundle " << index << " of placement group "
                           << e.rec.pg_id() << ", which this head records there: re-placing it";
      }
      return missing;
    });
  }
  // Held here, not recorded: strays from now on (those already known keep their first sighting);
  // the node's earlier strays that it no longer holds are forgotten.
  const auto now = Clock::now();
  std::map<std::tuple<std::string, std::string, int>, StrayBundle> mine;
  for (const auto& [pg_id, indexes] : holds) {
    for (int index : indexes) {
      if (RecordedOnLocked(pg_id, index, node_id)) continue;
      auto key = std::make_tuple(node_id, pg_id, index);
      auto old = strays_.find(key);
      bool same = old != strays_.end() && old->second.address == node_address;
      mine[key] = {node_address, same ? old->second.since : now};
      if (!same) {
        TORUS_LOG(WARNING) << "node " << node_id << " holds bundle " << index << " of placement group " << pg_id
                           << ", which this head does not record there: releasing it in " << stray_grace_.count()
                           << " ms unless a grant in flight records it by then";
      }
    }
  }
  auto first = strays_.lower_bound(std::make_tuple(node_id, std::string(), INT32_MIN));
  auto last = first;
  while (last != strays_.end() && std::get<0>(last->first) == node_id) ++last;
  strays_.erase(first, last);
  strays_.merge(mine);
}

void PlacementGroupManager::ReleaseStrayBundlesLocked(Clock::time_point now) {
  std::map<std::pair<std::string, std::string>, std::pair<std::string, std::vector<int>>> due;  // (node, pg)
  for (auto it = strays_.begin(); it != strays_.end();) {
    const auto& [node_id, pg_id, index] = it->first;
    auto pit = pgs_.find(pg_id);
    if (RecordedOnLocked(pg_id, index, node_id) || cluster_.NodeAddress(node_id) != it->second.address) {
      it = strays_.erase(it);  // recorded meanwhile (a grant finished), or the node is gone or another one
      continue;
    }
    if (now - it->second.since < stray_grace_ || (pit != pgs_.end() && pit->second.scheduling)) {
      ++it;  // within the grace, or a grant of its group is in flight: look again later
      continue;
    }
    auto& d = due[{node_id, pg_id}];
    d.first = it->second.address;
    d.second.push_back(index);
    it = strays_.erase(it);
  }
  if (due.empty()) return;
  std::vector<NodeCall> release;
  for (const auto& [key, what] : due) {
    const auto& [node_id, pg_id] = key;
    TORUS_LOG(WARNING) << "releasing " << what.second.size() << " bundle(s) of placement group " << pg_id
                       << " on node " << node_id << ": no live group records them there";
    release.push_back({node_id, what.first,
                       ReleasePayload(pg_id, what.second, "no placement group of the head holds this bundle")});
  }
  ReleaseInBackground(std::move(release));
}

}  // namespace torus
