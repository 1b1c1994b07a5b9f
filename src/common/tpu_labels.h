// The TPU node label keys (docs/tpu.md §4): the five torus.io/ keys a node sets from the TPU
// identity it detects, their ray.io/ spellings, and selector-key normalisation. Label vocabulary
// shared by every layer (common/labels.cc reserves these keys), so it lives in common/ below tpu/;
// tpu/topology.h re-exports it. Pure functions of their arguments, safe from any thread.
#pragma once

#include <map>
#include <string>
#include <string_view>

#include "common/status.h"

namespace torus::tpu {

// ---------------------------------------------------------------------------------------------
// TPU node label keys (§4)
// ---------------------------------------------------------------------------------------------

inline constexpr std::string_view kLabelAcceleratorType = "torus.io/accelerator-type";
inline constexpr std::string_view kLabelSliceName = "torus.io/tpu-slice-name";
inline constexpr std::string_view kLabelWorkerId = "torus.io/tpu-worker-id";
inline constexpr std::string_view kLabelTopology = "torus.io/tpu-topology";
inline constexpr std::string_view kLabelPodType = "torus.io/tpu-pod-type";

// Maps `ray.io/<k>` to `torus.io/<k>` for the five TPU keys above (accelerator-type,
// tpu-slice-name, tpu-worker-id, tpu-topology, tpu-pod-type); every other key is returned as is.
std::string NormalizeLabelKey(std::string_view key);

// True for the ten reserved keys: the five torus.io/ TPU keys and their ray.io/ spellings.
bool IsReservedTpuLabelKey(std::string_view key);

// Rewrites a selector's keys with NormalizeLabelKey. Giving both spellings of one key with
// different values is InvalidArgument naming the key; equal values merge into one entry.
// Values (`v`, `!v`, `in(a,b)`, ...) are compared as strings and not interpreted.
StatusOr<std::map<std::string, std::string>> NormalizeSelectorKeys(
    const std::map<std::string, std::string>& selector);

}  // namespace torus::tpu
