#include "head/slice_idle.h"

namespace torus {

std::string SliceIdleRule::HeadUnit(std::string_view pod_type) {
  return "TPU-" + std::string(pod_type) + "-head";
}

bool SliceIdleRule::ChipsFree(const SliceHostUse& u) { return u.tpu_available >= u.tpu_total; }

bool SliceIdleRule::HeadFree(const SliceHostUse& u) {
  return !u.head_total.Positive() || u.head_available >= ResourceAmount(1.0);
}

bool SliceIdleRule::HostBusy(int worker_id, bool chips_free, bool head_free) {
  return !chips_free || (worker_id == 0 && !head_free);
}

}  // namespace torus
