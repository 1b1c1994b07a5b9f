// The one rule for "is this TPU slice idle" (docs/tpu.md section 6), shared by the head's live
// slice index (placement: head/slice_index.cc) and the slice queries built from a node view
// (head/slices.cc), so that `torus slices` and the reservation scheduler can never disagree.
//
// A host is busy when any of its chips is in use, or, on worker 0, when the slice's head unit
// (the resource TPU-<pod>-head) exists and is taken. A slice is idle when it is intact and no
// host is busy.
//
// Threading: pure functions of their arguments; safe from any thread.
#pragma once

#include <string>
#include <string_view>

namespace torus {

struct SliceHostUse {
  double tpu_total = 0;
  double tpu_available = 0;
  double head_total = 0;      // TPU-<pod>-head on this host (0: none)
  double head_available = 0;
};

class SliceIdleRule {
 public:
  // The resource name of a pod type's head unit: "TPU-<pod_type>-head".
  static std::string HeadUnit(std::string_view pod_type);
  // Every chip of the host is available.
  static bool ChipsFree(const SliceHostUse& u);
  // The host has no head unit, or its head unit is available.
  static bool HeadFree(const SliceHostUse& u);
  // Whether worker `worker_id` of a slice holds anything (chips, or the head unit on worker 0).
  static bool HostBusy(int worker_id, bool chips_free, bool head_free);
  static bool HostBusy(int worker_id, const SliceHostUse& u) {
    return HostBusy(worker_id, ChipsFree(u), HeadFree(u));
  }
  static bool SliceIdle(bool intact, int busy_hosts) { return intact && busy_hosts == 0; }
};

}  // namespace torus
