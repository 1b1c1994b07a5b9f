// TPU slices as first-class resources (Torus extension; rules in docs/tpu.md).
//
//   torus::tpu::SliceOptions o;
//   o.topology = "4x4";
//   o.accelerator_version = "v6e";
//   auto slice = torus::tpu::CreateSlicePlacementGroup(o);   // one atomic reservation
//   slice.Wait(60);                                           // all hosts, or nothing
//   for (int i = 0; i < slice.NumBundles(); ++i)
//     ray::Task(Train).SetPlacementGroup(slice.GetPlacementGroup(), i).Remote();
//   // slice.Remove(), or drop the last handle: the slice is released.
//
// Thread-safe. Invalid options throw ray::internal::RayException with the spec's message.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "torus/api/placement_group.h"

namespace torus::tpu {

struct SliceOptions {
  std::string topology;             // "4x4", "2x2x2"
  std::string accelerator_version;  // "v6e", "TPU-V4", "tpu7x", "v5e" ...
  int num_slices = 1;
  std::optional<int> chips_per_vm;  // hosts with this many chips (default: the generation's)
  // Resources of each bundle; default {TPU: chips per host, CPU: 1} (one bundle per host).
  std::unordered_map<std::string, double> resources_per_bundle;
  std::string name;                 // unique among live reservations when not empty
  std::string strategy = "SPREAD";  // PACK, SPREAD, STRICT_PACK, STRICT_SPREAD
  // One selector for every bundle, or exactly one per bundle.
  std::vector<std::unordered_map<std::string, std::string>> bundle_label_selectors;
  bool detached = false;            // survive the creating job (released only by Remove)
  double timeout_s = -1;            // deadline for the first grant; < 0 = wait forever
};

// A reservation of whole slices. Copies share one reservation; it is released when the last
// copy is destroyed (unless detached) or on Remove().
class SlicePlacementGroup {
 public:
  SlicePlacementGroup() = default;
  // True once every host of every slice is reserved; false when timeout_s passes first (the
  // request stays queued). Throws when the reservation failed (deadline) or was removed.
  bool Wait(double timeout_s) const;
  // The ordinary placement group behind it: one bundle per host (or per chips group),
  // slice-major; use with SetPlacementGroup(pg, i).
  PlacementGroup GetPlacementGroup() const;
  int NumHosts() const;       // hosts per slice x num_slices
  int ChipsPerHost() const;
  int NumBundles() const;
  std::vector<std::string> SliceNames() const;  // granted slice per slice index
  std::string PodType() const;
  int Epoch() const;          // increases with each re-grant after a lost slice
  // Releases the slices (any state; idempotent). Work in the bundles ends.
  void Remove();

  struct State;

 private:
  explicit SlicePlacementGroup(std::shared_ptr<State> s) : state_(std::move(s)) {}
  friend SlicePlacementGroup CreateSlicePlacementGroup(const SliceOptions&);
  std::shared_ptr<State> state_;
};

SlicePlacementGroup CreateSlicePlacementGroup(const SliceOptions& options);

// Slices of that shape whose hosts are all alive and complete (spec section 6 "Cluster queries").
int GetNumIntactSlices(const std::string& topology, const std::string& accelerator_version,
                       std::optional<int> chips_per_vm = std::nullopt);
// Intact slices with every chip free and held by no reservation.
int GetNumReadySlices(const std::string& topology, const std::string& accelerator_version,
                      std::optional<int> chips_per_vm = std::nullopt);
// Node ids of the alive hosts of a slice, by worker id; empty for an unknown name.
std::vector<std::string> GetSliceNodes(const std::string& slice_name);

}  // namespace torus::tpu
