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

#include "common/resources.h"

namespace torus {

struct SliceHostUse {
  ResourceAmount tpu_total;
  ResourceAmount tpu_available;
  ResourceAmount head_total;      // TPU-<pod>-head on this host (0: none)
  ResourceAmount head_available;
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
