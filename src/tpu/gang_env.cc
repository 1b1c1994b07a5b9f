#include "tpu/gang_env.h"

#include <algorithm>

namespace torus::tpu {

EnvChanges GangEnv(const GangMember& m) {
  EnvChanges c;
  c.set[std::string(kEnvProcessId)] = std::to_string(m.rank);
  c.set[std::string(kEnvNumProcesses)] = std::to_string(m.num_processes);
  c.set[std::string(kEnvCoordinatorAddress)] = m.coordinator_address;
  c.set[std::string(kEnvJaxCoordinatorAddress)] = m.coordinator_address;
  c.set[std::string(kEnvSliceIndex)] = std::to_string(m.slice_index);
  c.set[std::string(kEnvReservationEpoch)] = std::to_string(m.epoch);
  if (m.num_slices > 1) {
    std::string coord = m.megascale_host;
    if (m.gen == Generation::kV7x) coord += ":" + std::to_string(kMegascalePort);
    c.set["MEGASCALE_COORDINATOR_ADDRESS"] = coord;
    c.set["MEGASCALE_PORT"] = std::to_string(kMegascalePort);
    c.set["MEGASCALE_NUM_SLICES"] = std::to_string(m.num_slices);
    c.set["MEGASCALE_SLICE_ID"] = std::to_string(m.slice_index);
  } else {
    c.unset = {"MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_PORT",
               "MEGASCALE_SLICE_ID"};
  }
  std::sort(c.unset.begin(), c.unset.end());
  return c;
}

}  // namespace torus::tpu
