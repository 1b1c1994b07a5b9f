// Environment of one process of a gang launch on a slice reservation (docs/tpu.md section 7,
// "Multislice" and "Gang launch"): what `jax.distributed.initialize` and multislice runtimes need.
// Pure functions; safe from any thread.
#pragma once

#include <string>

#include "tpu/chip_visibility.h"
#include "tpu/topology.h"

namespace torus::tpu {

// Variable names (docs/jobs.md).
inline constexpr std::string_view kEnvProcessId = "TORUS_PROCESS_ID";
inline constexpr std::string_view kEnvNumProcesses = "TORUS_NUM_PROCESSES";
inline constexpr std::string_view kEnvCoordinatorAddress = "TORUS_COORDINATOR_ADDRESS";
inline constexpr std::string_view kEnvSliceIndex = "TORUS_SLICE_INDEX";
inline constexpr std::string_view kEnvReservationEpoch = "TORUS_RESERVATION_EPOCH";
// JAX reads this one itself when initialize() gets no coordinator_address (jax 0.4.x).
inline constexpr std::string_view kEnvJaxCoordinatorAddress = "JAX_COORDINATOR_ADDRESS";
inline constexpr int kMegascalePort = 8081;

struct GangMember {
  Generation gen = Generation::kV6e;
  int rank = 0;                     // bundle index: slice-major
  int num_processes = 1;            // N
  int slice_index = 0;
  int num_slices = 1;
  int epoch = 0;
  std::string coordinator_address;  // host of bundle 0 + a port picked there ("h:p")
  std::string megascale_host;       // host of host 0 of slice 0 (no port)
};

// The variables to set and remove for `m`. Always sets the TORUS_* gang variables and
// JAX_COORDINATOR_ADDRESS. With num_slices > 1 sets MEGASCALE_COORDINATOR_ADDRESS (with ":8081"
// on v7x, as the GKE webhook does), MEGASCALE_PORT=8081, MEGASCALE_NUM_SLICES and
// MEGASCALE_SLICE_ID, overwriting inherited values; with one slice removes all four.
EnvChanges GangEnv(const GangMember& m);

// The MEGASCALE_* part of GangEnv alone, for process `slice_index` of a grant of `num_slices`
// slices whose slice 0 host 0 is `megascale_host` (no port): the four variables set when
// num_slices > 1, all four in `unset` (sorted) otherwise. The head gives it to every bundle of a
// slice reservation.
EnvChanges MegascaleEnv(Generation gen, const std::string& megascale_host, int num_slices,
                        int slice_index);

}  // namespace torus::tpu
