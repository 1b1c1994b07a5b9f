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
  EnvChanges mega = MegascaleEnv(m.gen, m.megascale_host, m.num_slices, m.slice_index);
  c.set.insert(mega.set.begin(), mega.set.end());
  c.unset = std::move(mega.unset);
  std::sort(c.unset.begin(), c.unset.end());
  return c;
}

EnvChanges MegascaleEnv(Generation gen, const std::string& megascale_host, int num_slices,
                        int slice_index) {
  EnvChanges c;
  if (num_slices > 1) {
    std::string coord = megascale_host;
    if (gen == Generation::kV7x) coord += ":" + std::to_string(kMegascalePort);
    c.set["MEGASCALE_COORDINATOR_ADDRESS"] = coord;
    c.set["MEGASCALE_PORT"] = std::to_string(kMegascalePort);
    c.set["MEGASCALE_NUM_SLICES"] = std::to_string(num_slices);
    c.set["MEGASCALE_SLICE_ID"] = std::to_string(slice_index);
  } else {
    c.unset = {"MEGASCALE_COORDINATOR_ADDRESS", "MEGASCALE_NUM_SLICES", "MEGASCALE_PORT",
               "MEGASCALE_SLICE_ID"};
  }
  return c;
}

}  // namespace torus::tpu
