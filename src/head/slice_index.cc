#include "head/slice_index.h"

#include "common/resources.h"
#include "head/slice_idle.h"
#include "tpu/topology.h"

namespace torus {

namespace {
const std::set<std::string> kNone;
}

SliceHostInfo MakeSliceHostInfo(std::string pod_type, std::string slice_name, std::string topology,
                                const std::string& worker_label, const SliceHostUse& use) {
  SliceHostInfo info;
  info.pod_type = std::move(pod_type);
  info.slice_name = std::move(slice_name);
  info.topology = std::move(topology);
  try {
    info.worker_id = std::stoi(worker_label);
  } catch (...) {
    info.worker_id = -1;
  }
  info.chips = static_cast<int>(use.tpu_total.Whole());
  info.chips_free = SliceIdleRule::ChipsFree(use);
  info.head_free = SliceIdleRule::HeadFree(use);
  return info;
}

void SliceIndex::Upsert(std::string_view node_id, const SliceHostInfo& info) {
  if (UpdateBusyInPlace(node_id, info)) return;
  std::string name;
  int worker = -1, hosts = 0;
  if (!SlotOf(node_id, info, &name, &worker, &hosts)) {
    Remove(node_id);
    return;
  }
  auto mit = members_.find(node_id);
  if (mit != members_.end() && (mit->second.slice != name || mit->second.worker != worker)) {
    Remove(node_id);
    mit = members_.end();
  }
  auto [sit, fresh_slice] = slices_.try_emplace(name);
  Slice& s = sit->second;
  const std::string_view key = sit->first;
  if (fresh_slice) {
    s.name = name;
    s.pod_type = info.pod_type;
    s.topology = info.topology;
    s.hosts_expected = hosts;
    s.hosts.assign(hosts, std::string_view());
    s.chips.assign(hosts, 0);
  }
  bool busy = SliceIdleRule::HostBusy(worker, info.chips_free, info.head_free);
  if (mit == members_.end()) {
    if (worker < 0 || worker >= s.hosts_expected || !s.hosts[worker].empty() ||
        s.pod_type != info.pod_type) {
      s.duplicate = true;
      const bool could_take = worker >= 0 && worker < s.hosts_expected && s.pod_type == info.pod_type;
      members_[node_id] = {key, -1, busy, could_take ? worker : -1, info.chips};
      Evaluate(s);
      return;
    }
    s.hosts[worker] = node_id;
    members_[node_id] = {key, worker, busy};
    s.busy += busy;
  } else if (mit->second.worker >= 0 && mit->second.busy != busy) {
    s.busy += busy ? 1 : -1;
    mit->second.busy = busy;
  }
  if (mit == members_.end() || mit->second.worker >= 0) s.chips[worker] = info.chips;
  Evaluate(s);
}

bool SliceIndex::UpdateBusyInPlace(std::string_view node_id, const SliceHostInfo& info) {
  // The common update: a member host whose slice, worker id, pod type and chips are unchanged
  // and whose chips or head unit were taken or given back (each bundle reply of a reservation).
  // Only the slice's busy count and idle state can change then; the full path in Upsert would
  // re-parse the pod type and re-check every host of the slice (O(hosts) per host update).
  auto mit = members_.find(node_id);
  if (mit == members_.end() || mit->second.worker < 0 || info.chips <= 0) return false;
  Member& m = mit->second;
  bool anonymous = info.slice_name.empty();
  auto sit = slices_.find(std::string(m.slice));
  if (sit == slices_.end() || m.slice != (anonymous ? node_id : std::string_view(info.slice_name)) ||
      m.worker != (anonymous ? 0 : info.worker_id) || sit->second.pod_type != info.pod_type ||
      sit->second.chips[m.worker] != info.chips) {
    return false;
  }
  Slice& s = sit->second;
  bool busy = SliceIdleRule::HostBusy(m.worker, info.chips_free, info.head_free);
  if (busy == m.busy) return true;
  s.busy += busy ? 1 : -1;
  m.busy = busy;
  bool idle = SliceIdleRule::SliceIdle(s.intact, s.busy);
  if (idle != s.idle) {
    s.idle = idle;
    NoteIdle(s);
  }
  return true;
}

bool SliceIndex::SlotOf(std::string_view node_id, const SliceHostInfo& info, std::string* name,
                        int* worker, int* hosts) {
  if (info.pod_type.empty() || info.chips <= 0) return false;
  auto pt = tpu::ParsePodType(info.pod_type);
  if (!pt.ok()) return false;
  *hosts = tpu::HostsOfSliceFromNode(info.chips, *pt);
  *name = info.slice_name;
  *worker = info.worker_id;
  if (name->empty()) {
    if (*hosts != 1) return false;  // a multi-host slice needs its name
    *name = std::string(node_id);
    *worker = 0;
  }
  return true;
}

void SliceIndex::NoteIdle(const Slice& s) {
  if (s.idle) {
    idle_[s.pod_type].insert(s.name);
  } else if (auto it = idle_.find(s.pod_type); it != idle_.end()) {
    it->second.erase(s.name);
  }
}

void SliceIndex::Remove(std::string_view node_id) {
  auto mit = members_.find(node_id);
  if (mit == members_.end()) return;
  Member m = mit->second;
  members_.erase(mit);
  auto sit = slices_.find(std::string(m.slice));
  if (sit == slices_.end()) return;
  Slice& s = sit->second;
  if (m.worker >= 0) {
    s.hosts[m.worker] = std::string_view();
    s.chips[m.worker] = 0;
    s.busy -= m.busy;
    if (s.duplicate) PromoteDuplicate(s, m.worker);
  } else {
    // A duplicate left: re-check from the members that remain.
    s.duplicate = false;
    for (const auto& [id, mm] : members_) {
      if (mm.slice == s.name && mm.worker < 0) s.duplicate = true;
    }
  }
  Evaluate(s);
  bool empty = !s.duplicate;
  for (const auto& h : s.hosts) empty = empty && h.empty();
  if (empty) {
    idle_[s.pod_type].erase(s.name);
    slices_.erase(sit);
  }
}

void SliceIndex::PromoteDuplicate(Slice& s, int worker) {
  // A host that claimed this worker id while another held it (a replacement that registered
  // before the host it replaces was declared dead) takes the slot now it is free.
  bool more = false;
  for (auto& [id, mm] : members_) {
    if (mm.slice != s.name || mm.worker >= 0) continue;
    if (s.hosts[worker].empty() && mm.claimed == worker) {
      mm.worker = worker;
      mm.claimed = -1;
      s.hosts[worker] = id;
      s.chips[worker] = mm.chips;
      s.busy += mm.busy;
      continue;
    }
    more = true;
  }
  s.duplicate = more;
}

void SliceIndex::Evaluate(Slice& s) {
  bool was_intact = s.intact;
  auto pt = tpu::ParsePodType(s.pod_type);
  int chips = 0;
  bool all = !s.duplicate;
  for (int w = 0; w < s.hosts_expected; ++w) {
    all = all && !s.hosts[w].empty();
    chips += s.chips[w];
  }
  s.intact = all && pt.ok() && chips == pt->chips;
  s.idle = SliceIdleRule::SliceIdle(s.intact, s.busy);
  if (s.intact != was_intact) intact_[s.pod_type] += s.intact ? 1 : -1;
  NoteIdle(s);
}

const std::set<std::string>& SliceIndex::Idle(const std::string& pod_type) const {
  auto it = idle_.find(pod_type);
  return it == idle_.end() ? kNone : it->second;
}

const SliceIndex::Slice* SliceIndex::FirstIdle(const std::string& pod_type, const std::string& only,
                                               const std::function<bool(const Slice&)>& accept) const {
  const auto& idle = Idle(pod_type);
  if (!only.empty()) {
    if (!idle.count(only)) return nullptr;
    const Slice* s = Find(only);
    return s && accept(*s) ? s : nullptr;
  }
  for (const auto& name : idle) {
    const Slice* s = Find(name);
    if (s && accept(*s)) return s;
  }
  return nullptr;
}

int SliceIndex::NumIntact(const std::string& pod_type) const {
  auto it = intact_.find(pod_type);
  return it == intact_.end() ? 0 : it->second;
}

const SliceIndex::Slice* SliceIndex::Find(const std::string& name) const {
  auto it = slices_.find(name);
  return it == slices_.end() ? nullptr : &it->second;
}

}  // namespace torus
