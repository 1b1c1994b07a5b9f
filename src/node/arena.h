// First-fit allocator over the node's object-store arena: hands out byte ranges of one large
// shared-memory segment that every process of the node maps once. Freed ranges are coalesced
// and reused while their pages are still resident, so a steady stream of large Puts does not pay
// page faults; once more than `resident_free_limit` freed bytes accumulate, they are handed back
// to the OS (the caller punches them, see TakeRangesToRelease). Not thread-safe: the node calls
// it under its mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

namespace torus {

// The default arena size of a node (pure): the host's budget, min(30 % of RAM, 80 % of the free
// space of /dev/shm), shared equally among the nodes of this host: max(`expected_nodes` (what
// `torus up` starts here at once), the live sibling nodes + 1). Nodes started one by one share
// by the count they see, so the first keeps the whole budget (it cannot be shrunk later).
uint64_t DefaultArenaBytes(uint64_t ram_bytes, uint64_t shm_free_bytes, size_t live_siblings,
                           int expected_nodes);
// The nodes a new node shares this host with: max(expected_nodes, live_siblings + 1).
size_t HostShare(size_t live_siblings, int expected_nodes);

class ArenaAllocator {
 public:
  static constexpr uint64_t kAlign = 64;
  ArenaAllocator(uint64_t capacity, uint64_t resident_free_limit);

  // Offset of a new range of `size` bytes, or nullopt when no free range is large enough.
  std::optional<uint64_t> Allocate(uint64_t size);
  // Returns a range previously allocated with that offset. Unknown offsets are ignored.
  void Free(uint64_t offset);

  uint64_t capacity() const { return capacity_; }
  uint64_t used() const { return used_; }
  uint64_t largest_free() const;
  // Free ranges whose pages should be given back to the OS now (empty unless the resident-free
  // budget is exceeded).
  std::vector<std::pair<uint64_t, uint64_t>> TakeRangesToRelease();

 private:
  uint64_t capacity_;
  uint64_t resident_free_limit_;
  uint64_t used_ = 0;
  uint64_t resident_free_ = 0;
  std::map<uint64_t, uint64_t> free_;       // offset -> size
  std::map<uint64_t, uint64_t> allocated_;  // offset -> size (rounded)
};

}  // namespace torus
