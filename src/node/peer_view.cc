#include "node/peer_view.h"

#include <algorithm>
#include <limits>

#include <set>

namespace torus {

void PeerView::Put(const rpc::NodeRecord& rec) {
  if (!rec.alive() || rec.node_id() == self_) {
    Drop(rec.node_id());
    return;
  }
  NodeEntry fresh;
  SetFromRecord(names_, rec, &fresh);
  fresh.alive = true;
  if (auto c = charges_.find(rec.node_id()); c != charges_.end()) {
    // Leases sent there lately may not be in this view of it yet: still charged.
    auto now = std::chrono::steady_clock::now();
    auto& held = c->second;
    held.erase(std::remove_if(held.begin(), held.end(), [&](const HeldCharge& h) { return h.until <= now; }),
               held.end());
    if (held.empty()) {
      charges_.erase(c);
    } else {
      ResourceMap avail = ToResourceMap(names_, fresh.Available());
      for (const auto& h : held) Subtract(avail, h.res);
      SetAvailable(names_, avail, &fresh);
    }
  }
  auto [it, added] = nodes_.try_emplace(rec.node_id());
  // Out first when its labels or totals change (the index reads the entry to take it out);
  // totals are interned, so the same pointer means the same totals.
  if (!added && (it->second.labels != fresh.labels || it->second.total != fresh.total)) index_.Remove(it->second);
  fresh.placement_slot = it->second.placement_slot;
  it->second = std::move(fresh);
  index_.Upsert(it->first, it->second);
  SweepTotals(names_, nodes_, &totals_live_);
}

void PeerView::Drop(const std::string& id) {
  charges_.erase(id);
  auto it = nodes_.find(id);
  if (it == nodes_.end()) return;
  index_.Remove(it->second);
  nodes_.erase(it);
}

void PeerView::ApplySnapshot(const rpc::ListReply& snapshot) {
  std::set<std::string_view> in;
  for (const auto& n : snapshot.nodes()) in.insert(n.node_id());
  for (auto it = nodes_.begin(); it != nodes_.end();) {
    auto next = std::next(it);
    if (!in.count(it->first)) Drop(it->first);
    it = next;
  }
  for (const auto& n : snapshot.nodes()) Put(n);
}

void PeerView::ApplyDelta(const rpc::HeartbeatReply& reply) {
  for (const auto& id : reply.removed_node_ids()) Drop(id);
  for (const auto& n : reply.nodes()) Put(n);
}

std::optional<PeerView::Target> PeerView::Pick(const ResourceMap& res, const LabelSelectorTerms& selector,
                                               bool or_capacity) const {
  PlacementIndex::Demand d = index_.Compile(res, selector);
  std::optional<Target> out;
  auto first = [&](uint32_t slot) {
    const std::string& id = index_.Id(slot);
    out = Target{id, nodes_.at(id).address};
    return false;
  };
  index_.ForEach(d, /*use_total=*/false, first);
  if (!out && or_capacity) index_.ForEach(d, /*use_total=*/true, first);
  return out;
}

namespace {
// How many requests of `res` fit in `avail` (fractional; the least over res's resources). A
// ratio for a preference only: the fit itself is decided exactly (Fits, the placement index).
double Room(const ResourceMap& avail, const ResourceMap& res) {
  double room = std::numeric_limits<double>::infinity();
  for (const auto& [name, amount] : res) {
    if (!amount.Positive()) continue;
    auto it = avail.find(name);
    double have = it == avail.end() ? 0.0 : static_cast<double>(it->second.units());
    room = std::min(room, have / static_cast<double>(amount.units()));
  }
  return room;
}
}  // namespace

std::optional<PeerView::Target> PeerView::PickRoomier(const ResourceMap& res, const LabelSelectorTerms& selector,
                                                      const ResourceMap& local) const {
  auto target = Pick(res, selector, /*or_capacity=*/false);
  if (!target) return target;
  const NodeEntry& n = nodes_.at(target->node_id);
  if (Room(ToResourceMap(names_, n.Available()), res) <= Room(local, res)) return std::nullopt;
  return target;
}

bool PeerView::AnyCouldFit(const ResourceMap& res, const LabelSelectorTerms& selector) const {
  bool any = false;
  index_.ForEach(index_.Compile(res, selector), /*use_total=*/true, [&](uint32_t) {
    any = true;
    return false;
  });
  return any;
}

void PeerView::Charge(const std::string& node_id, const ResourceMap& res) {
  auto it = nodes_.find(node_id);
  if (it == nodes_.end()) return;
  ResourceMap avail = ToResourceMap(names_, it->second.Available());
  Subtract(avail, res);
  SetAvailable(names_, avail, &it->second);
  index_.Upsert(it->first, it->second);
  charges_[node_id].push_back({res, std::chrono::steady_clock::now() + kChargeHold});
}

}  // namespace torus
