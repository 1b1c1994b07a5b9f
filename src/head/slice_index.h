// The head's live index of TPU slices, kept up to date node by node as nodes register, report
// their ledgers and die, so that choosing slices for a reservation costs O(slices taken), not
// O(nodes in the cluster) (docs/tpu.md section 6; at 10,000 hosts a decision takes
// microseconds: bench/slice_sched_bench).
//
// A slice is the set of alive nodes with one slice-name label (or, without one, a single-host
// node by itself). It is intact when every worker id 0..H-1 is present exactly once and the
// chips add up to the pod type's; idle by SliceIdleRule (head/slice_idle.h), the rule the slice
// queries use too. Thread-compatible (the head guards it with its mutex).
#pragma once

#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "head/slice_idle.h"

namespace torus {

// What the index needs to know about one alive node (the head extracts it from the record).
struct SliceHostInfo {
  std::string pod_type;    // torus.io/tpu-pod-type; empty = not a TPU host
  std::string slice_name;  // torus.io/tpu-slice-name; empty = anonymous single-host slice
  std::string topology;    // torus.io/tpu-topology
  int worker_id = -1;      // torus.io/tpu-worker-id
  int chips = 0;           // TPU total
  bool chips_free = false; // TPU available == total
  bool head_free = true;   // TPU-<pod>-head available (worker 0), or absent
};

// The index's view of a node from its TPU labels and `use` (SliceIdleRule's reading of its
// resources); `worker_label` is torus.io/tpu-worker-id (unparsable: -1).
SliceHostInfo MakeSliceHostInfo(std::string pod_type, std::string slice_name, std::string topology,
                                const std::string& worker_label, const SliceHostUse& use);

class SliceIndex {
 public:
  struct Slice {
    std::string name;
    std::string pod_type;
    std::string topology;
    int hosts_expected = 0;
    std::vector<std::string_view> hosts;  // node id per worker id ("" = missing)
    std::vector<int> chips;          // per worker id
    int busy = 0;                    // hosts with a chip or the head unit in use
    bool duplicate = false;          // a worker id seen twice / out of range
    bool intact = false;
    bool idle = false;
  };

  // Node `node_id` is alive with `info` (added, or updated in place). The index keeps views of
  // node ids, not copies (10,000 hosts: ~130 bytes each saved): the string `node_id` views must
  // stay alive, unchanged, while the node is indexed (the head passes its node table's keys).
  void Upsert(std::string_view node_id, const SliceHostInfo& info);
  // Node `node_id` is gone (dead or left).
  void Remove(std::string_view node_id);

  // Idle slices of a pod type, in name order.
  const std::set<std::string>& Idle(const std::string& pod_type) const;
  // The first idle slice of `pod_type`, in name order, that `accept` takes (or `only` when not
  // empty); nullptr when none. Costs O(log slices + idle slices refused), never a node scan.
  const Slice* FirstIdle(const std::string& pod_type, const std::string& only,
                         const std::function<bool(const Slice&)>& accept) const;
  int NumIntact(const std::string& pod_type) const;
  const Slice* Find(const std::string& name) const;
  size_t size() const { return slices_.size(); }

 private:
  struct Member {
    std::string_view slice;  // views its slice's key in slices_ (a slice outlives its members)
    int worker = -1;      // -1: a duplicate (its worker id taken, out of range, or another pod type)
    bool busy = false;    // a duplicate's is counted once it takes a slot
    int claimed = -1;     // a duplicate's worker id, when it could take that slot once it is free
    int chips = 0;        // a duplicate's chips, for that
  };
  void Evaluate(Slice& s);  // recompute intact/idle and the idle set / counters
  // Slot `worker` of `s` just became free while `s` has duplicates: the one that claimed it takes
  // it; s.duplicate is recomputed. O(members).
  void PromoteDuplicate(Slice& s, int worker);
  // The fast path of Upsert: only the host's busy state changed; false when it does not apply.
  bool UpdateBusyInPlace(std::string_view node_id, const SliceHostInfo& info);
  // The slice name, worker id and hosts per slice `info` puts the node in; false when it
  // belongs to no slice (not a TPU host, unknown pod type, multi-host without a slice name).
  static bool SlotOf(std::string_view node_id, const SliceHostInfo& info, std::string* name,
                     int* worker, int* hosts);
  void NoteIdle(const Slice& s);  // the idle set follows s.idle

  std::unordered_map<std::string, Slice> slices_;
  std::unordered_map<std::string_view, Member> members_;  // node id -> where it counts
  std::map<std::string, std::set<std::string>> idle_;     // pod type -> idle slice names
  std::map<std::string, int> intact_;                     // pod type -> intact slices
};

}  // namespace torus
