#include "node/arena.h"

#include <algorithm>

namespace torus {

size_t HostShare(size_t live_siblings, int expected_nodes) {
  return std::max<size_t>(live_siblings + 1, expected_nodes > 0 ? static_cast<size_t>(expected_nodes) : 1);
}

uint64_t DefaultArenaBytes(uint64_t ram_bytes, uint64_t shm_free_bytes, size_t live_siblings,
                           int expected_nodes) {
  uint64_t budget = std::min<uint64_t>(ram_bytes / 10 * 3, shm_free_bytes / 10 * 8);
  return budget / HostShare(live_siblings, expected_nodes);
}

ArenaAllocator::ArenaAllocator(uint64_t capacity, uint64_t resident_free_limit)
    : capacity_(capacity / kAlign * kAlign), resident_free_limit_(resident_free_limit) {
  if (capacity_ > 0) free_[0] = capacity_;
}

std::optional<uint64_t> ArenaAllocator::Allocate(uint64_t size) {
  uint64_t need = std::max<uint64_t>(kAlign, (size + kAlign - 1) / kAlign * kAlign);
  // First fit from the lowest offset: keeps live data packed at the start, where pages are
  // most likely still resident.
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    uint64_t off = it->first;
    uint64_t rest = it->second - need;
    free_.erase(it);
    if (rest > 0) free_[off + need] = rest;
    allocated_[off] = need;
    used_ += need;
    resident_free_ -= std::min(resident_free_, need);
    return off;
  }
  return std::nullopt;
}

void ArenaAllocator::Free(uint64_t offset) {
  auto a = allocated_.find(offset);
  if (a == allocated_.end()) return;
  uint64_t size = a->second;
  allocated_.erase(a);
  used_ -= size;
  resident_free_ += size;
  auto next = free_.lower_bound(offset);
  if (next != free_.end() && offset + size == next->first) {
    size += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      prev->second += size;
      return;
    }
  }
  free_[offset] = size;
}

uint64_t ArenaAllocator::largest_free() const {
  uint64_t m = 0;
  for (const auto& [o, s] : free_) m = std::max(m, s);
  return m;
}

std::vector<std::pair<uint64_t, uint64_t>> ArenaAllocator::TakeRangesToRelease() {
  if (resident_free_ <= resident_free_limit_) return {};
  resident_free_ = 0;
  return {free_.begin(), free_.end()};
}

}  // namespace torus
