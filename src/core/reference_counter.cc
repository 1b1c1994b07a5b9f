#include "core/reference_counter.h"

#include <algorithm>
#include <charconv>

#include "common/ids.h"

namespace torus::core {

std::string OwnerOf(const std::string& id) {
  auto at = id.find('@');
  return at == std::string::npos ? std::string() : id.substr(at + 1);
}

std::string HexOf(const std::string& id) {
  auto at = id.find('@');
  return at == std::string::npos ? id : id.substr(0, at);
}

std::string ReturnIdOf(const std::string& first, int index) {
  if (index == 0) return first;
  // The counter is the 16 hex digits after the worker's 16.
  constexpr size_t kAt = 16, kLen = 16;
  uint64_t v = 0;
  if (first.size() < kAt + kLen ||
      std::from_chars(first.data() + kAt, first.data() + kAt + kLen, v, 16).ec != std::errc()) {
    return first + "#" + std::to_string(index);  // not a task's id
  }
  std::string id = first;
  id.replace(kAt, kLen, Hex64(v + static_cast<uint64_t>(index)));
  return id;
}

rpc::ObjectLocation StoreLocation(const std::string& key, const std::string& node_id,
                                  const std::string& node_address) {
  rpc::ObjectLocation loc;
  loc.set_in_shm(true);
  loc.set_key(key);
  loc.set_node_id(node_id);
  loc.set_node_address(node_address);
  return loc;
}

void ReferenceCounter::SetIdentity(std::string self_address, std::string node_id,
                                   std::string node_address) {
  self_address_ = std::move(self_address);
  node_id_ = std::move(node_id);
  node_address_ = std::move(node_address);
}

ObjectEntry* ReferenceCounter::Find(const std::string& id) {
  auto it = objects_.find(id);
  return it == objects_.end() ? nullptr : &it->second;
}

void ReferenceCounter::RemoveLocal(const std::string& id) {
  auto it = objects_.find(id);
  if (it == objects_.end()) return;
  if (--it->second.local_refs <= 0) MaybeFreeAt(it);
}

void ReferenceCounter::Unpin(const std::string& id) {
  auto it = objects_.find(id);
  if (it == objects_.end()) return;
  if (--it->second.pins <= 0 && it->second.local_refs <= 0) MaybeFreeAt(it);
}

void ReferenceCounter::ReleaseIfUnused(const std::string& id) {
  auto it = objects_.find(id);
  if (it != objects_.end() && it->second.Unused()) MaybeFreeAt(it);
}

void ReferenceCounter::MaybeFree(const std::string& id) {
  auto it = objects_.find(id);
  if (it == objects_.end()) return;
  MaybeFreeAt(it);
}

void ReferenceCounter::MaybeFreeAt(Map::iterator it) {
  ObjectEntry& e = it->second;
  if (e.local_refs > 0 || e.pins > 0 || e.HasBorrowers() || e.registering) return;
  if (e.owned && e.lineage_refs > 0) {
    // A kept task takes it as an argument. Evicted: nothing left to free until that task goes. A
    // small value (or an error) of ours cannot be lost: kept as it is, for that task's rebuild.
    if (e.evicted || (e.ready && !e.in_shm)) return;
  }
  if (!e.owned && e.fetching) return;  // the fetch thread will find no entry and drop the value
  if (!e.owned && e.borrow_regs > 0) QueueBorrowRelease(it->first, e.borrow_regs);
  if (e.HasNested()) {
    // The value held the objects it refers to: let them go once it is gone.
    std::vector<std::string> nested = std::move(e.links->nested);
    e.links->nested.clear();
    e.borrow_regs = 0;  // queued above
    MaybeFreeAt(it);    // frees this one (its nested list is empty now)
    for (const auto& n : nested) RemoveLocal(n);
    return;
  }
  FreeRequest local{node_address_, {}};
  FreeRequest remote;
  if (e.owned && e.in_shm && e.shm.node_id() == node_id_) local.keys.push_back(e.shm.key());
  if (e.owned && e.in_shm && e.shm.node_id() != node_id_) {
    remote.node_address = e.shm.node_address();
    remote.keys.push_back(e.shm.key());
  }
  if (e.has_local_copy) local.keys.push_back(e.local_copy.key());
  std::shared_ptr<ObjectEntry::Lineage> lineage;
  if (e.owned && e.lineage_refs > 0 && e.lineage) {
    // A kept task still takes it as an argument: keep what rebuilds it, drop the value.
    e.evicted = true;
    e.ready = false;
    e.is_error = false;
    e.in_shm = false;
    e.has_local_copy = false;
    e.inline_data.reset();
  } else {
    lineage = std::move(e.lineage);
    objects_.erase(it);
  }
  if (hooks_.free) {
    if (!local.keys.empty()) hooks_.free(std::move(local));
    if (!remote.node_address.empty()) hooks_.free(std::move(remote));
  }
  if (lineage) ReleaseLineage(std::move(lineage));
}

bool ReferenceCounter::SetLineage(const std::string& id, std::shared_ptr<TaskRecord> task,
                                  std::vector<std::string> args, size_t bytes) {
  ObjectEntry* e = Find(id);
  if (!e || !e->owned || lineage_bytes_ + bytes > lineage_budget_) return false;
  std::shared_ptr<ObjectEntry::Lineage> older = std::move(e->lineage);  // a rebuilt value's
  std::erase_if(args, [&](const std::string& a) {
    ObjectEntry* ae = Find(a);
    if (!ae || !ae->owned) return true;
    ae->lineage_refs++;
    return false;
  });
  lineage_bytes_ += bytes;
  e->lineage = std::make_shared<ObjectEntry::Lineage>(
      ObjectEntry::Lineage{std::move(task), std::move(args), bytes});
  if (older) ReleaseLineage(std::move(older));
  return true;
}

void ReferenceCounter::ReleaseLineage(std::shared_ptr<ObjectEntry::Lineage> l) {
  // A worklist, not recursion: a long chain of tasks (x = f(x), many times over) is freed in
  // one go when its last value goes.
  releasing_.push_back(std::move(l));
  if (releasing_.size() > 1) return;  // an outer call drains it
  while (!releasing_.empty()) {
    auto& cur = releasing_.front();
    lineage_bytes_ -= std::min(lineage_bytes_, cur->bytes);
    for (const auto& a : cur->args) {
      auto it = objects_.find(a);
      if (it == objects_.end()) continue;
      if (--it->second.lineage_refs <= 0) {
        it->second.lineage_refs = 0;
        if (it->second.Unused()) MaybeFreeAt(it);  // may queue more behind `cur`
      }
    }
    releasing_.pop_front();
  }
}

bool ReferenceCounter::AdjustBorrower(ObjectEntry& e, const std::string& addr, int delta) {
  auto& borrowers = e.L().borrowers;
  auto b = std::find_if(borrowers.begin(), borrowers.end(),
                        [&](const auto& p) { return p.first == addr; });
  int before = b == borrowers.end() ? 0 : b->second;
  int after = std::max(0, before + delta);
  if (b == borrowers.end()) {
    if (after > 0) borrowers.emplace_back(addr, after);
  } else if (after > 0) {
    b->second = after;
  } else {
    borrowers.erase(b);
  }
  if (addr != self_address_ && after != before) {
    auto& st = borrowers_[addr];
    st.regs += after - before;
    if (st.regs <= 0) borrowers_.erase(addr);
  }
  return before > 0 && borrowers.empty();
}

void ReferenceCounter::BorrowObjects(const std::string& addr, int delta,
                                     const std::vector<std::string>& ids,
                                     std::vector<std::string>* unknown) {
  std::vector<std::string> unborrowed;
  for (const std::string& id : ids) {
    auto it = objects_.find(id);
    if (it == objects_.end() || !it->second.owned) {
      unknown->push_back(id);
      continue;
    }
    if (AdjustBorrower(it->second, addr, delta)) unborrowed.push_back(id);
  }
  for (const auto& id : unborrowed) MaybeFree(id);
}

std::vector<std::string> ReferenceCounter::BorrowerAddresses() const {
  std::vector<std::string> addrs;
  for (const auto& [addr, st] : borrowers_) addrs.push_back(addr);
  return addrs;
}

ReferenceCounter::BorrowerState* ReferenceCounter::FindBorrower(const std::string& addr) {
  auto it = borrowers_.find(addr);
  return it == borrowers_.end() ? nullptr : &it->second;
}

void ReferenceCounter::DropBorrower(const std::string& addr) {
  borrowers_.erase(addr);
  std::vector<std::string> unborrowed;
  for (auto& [id, e] : objects_) {
    if (!e.HasBorrowers()) continue;
    auto& borrowers = e.links->borrowers;
    auto p = std::find_if(borrowers.begin(), borrowers.end(),
                          [&](const auto& x) { return x.first == addr; });
    if (p == borrowers.end()) continue;
    borrowers.erase(p);
    if (borrowers.empty()) unborrowed.push_back(id);
  }
  for (const auto& id : unborrowed) MaybeFree(id);
}

bool ReferenceCounter::OnProbe(const std::string& addr, ProbeOutcome outcome, int* regs) {
  auto it = borrowers_.find(addr);
  if (it == borrowers_.end()) return false;
  BorrowerState& b = it->second;
  switch (outcome) {
    case ProbeOutcome::kAnswered: b.refused = b.timeouts = 0; return false;
    case ProbeOutcome::kRefused: b.refused++; break;
    case ProbeOutcome::kTimedOut: b.timeouts++; break;
  }
  if (b.refused < 2 && b.timeouts < 10) return false;
  *regs = b.regs;
  DropBorrower(addr);
  return true;
}

void ReferenceCounter::AdoptNested(ObjectEntry* outer, const std::vector<std::string>& nested) {
  for (const std::string& n : nested) {
    if (OwnerOf(n) == self_address_) {
      // Ours: the executor registered us with ourselves; that becomes the outer value's local
      // reference (or is dropped).
      auto nit = objects_.find(n);
      if (nit == objects_.end() || !nit->second.owned) continue;
      bool last = AdjustBorrower(nit->second, self_address_, -1);
      if (outer) {
        nit->second.local_refs++;
        outer->L().nested.push_back(n);
      } else if (last) {
        MaybeFreeAt(nit);
      }
    } else if (outer) {
      ObjectEntry& ne = Entry(n);
      ne.local_refs++;
      ne.borrow_regs++;
      outer->L().nested.push_back(n);
    } else {
      QueueBorrowRelease(n, 1);
    }
  }
}

void ReferenceCounter::QueueBorrowRelease(const std::string& id, int n) {
  std::string owner = OwnerOf(id);
  if (owner.empty() || owner == self_address_ || n <= 0) return;
  pending_releases_[owner].emplace_back(id, n);
  if (hooks_.releases_queued) hooks_.releases_queued();
}

ReferenceCounter::Releases ReferenceCounter::TakePendingReleases() {
  Releases out;
  out.swap(pending_releases_);
  return out;
}

void ReferenceCounter::QueueAllBorrowReleases() {
  for (auto& [id, e] : objects_) {
    if (!e.owned && e.borrow_regs > 0) {
      QueueBorrowRelease(id, e.borrow_regs);
      e.borrow_regs = 0;
    }
  }
}

bool ReferenceCounter::OwnsLiveObjects() const {
  for (const auto& [id, e] : objects_) {
    if (e.owned) return true;
  }
  return false;
}

std::vector<std::string> ReferenceCounter::Clear() {
  std::vector<std::string> keys;
  for (auto& [id, e] : objects_) {
    if (e.owned && e.in_shm && e.shm.node_id() == node_id_) keys.push_back(e.shm.key());
    if (e.has_local_copy) keys.push_back(e.local_copy.key());
  }
  objects_.clear();
  return keys;
}

}  // namespace torus::core
