// torus::tpu: slice reservations over placement groups (docs/tpu.md section 6). Options are
// validated here with the spec's messages, the bundles built slice-major, and the head chooses
// whole idle slices and reserves them in one prepare/commit.
#include <mutex>

#include "core/throw_status.h"
#include "torus/api.h"
#include "torus/internal/runtime.h"
#include "tpu/topology.h"

namespace torus::tpu {

struct SlicePlacementGroup::State {
  std::string id;
  bool detached = false;
  int num_bundles = 0;
  int hosts = 0;
  int chips_per_host = 0;
  std::string pod_type;
  PlacementGroupCreationOptions options;
  std::mutex mu;
  bool removed = false;

  ~State() {
    // RAII: dropping the last handle releases a non-detached reservation.
    if (detached || removed) return;
    if (auto* rt = internal::GetRuntime()) {
      try {
        rt->RemovePlacementGroup(id);
      } catch (...) {
      }
    }
  }
};

namespace {
[[noreturn]] void Invalid(const Status& s) { core::ThrowStatus(s); }

std::optional<int> OptPositive(const std::optional<int>& v) { return v; }

// The user's label selector of one bundle of slice `slice_index`, keys normalised. Throws for a
// key Torus keeps for itself, or when bundles of one slice name two slices (`slice_pins`: the
// slice named so far per slice index).
internal::LabelSelector UserBundleSelector(const internal::LabelSelector& user, int slice_index,
                                           std::map<std::string, std::string>* slice_pins) {
  internal::LabelSelector sel;
  std::map<std::string, std::string> ordered(user.begin(), user.end());
  auto norm = NormalizeSelectorKeys(ordered);
  if (!norm.ok()) Invalid(norm.status());
  for (const auto& [k, v] : *norm) {
    if (k == kLabelWorkerId) {
      Invalid(InvalidArgument("label selector key '" + k +
                              "' is not allowed: placement within a slice belongs to Torus"));
    }
    if (k == kLabelSliceName) {
      std::string key = std::to_string(slice_index);
      auto [pin, fresh] = slice_pins->emplace(key, v);
      if (!fresh && pin->second != v) {
        Invalid(InvalidArgument("bundles of slice index " + key + " name two slices ('" +
                                pin->second + "' and '" + v + "') in " + std::string(kLabelSliceName)));
      }
    }
    sel[k] = v;
  }
  return sel;
}
}  // namespace

SlicePlacementGroup CreateSlicePlacementGroup(const SliceOptions& o) {
  internal::ValidateBundles({o.resources_per_bundle});
  if (o.num_slices < 1) Invalid(InvalidArgument("num_slices must be at least 1, got " + std::to_string(o.num_slices)));
  auto shape = ComputeSliceShape(o.accelerator_version, o.topology, OptPositive(o.chips_per_vm));
  if (!shape.ok()) Invalid(shape.status());
  double tpu = shape->chips_per_host;
  auto it = o.resources_per_bundle.find("TPU");
  if (it != o.resources_per_bundle.end()) tpu = it->second;
  auto layout = ComputeBundleLayout(*shape, tpu, o.num_slices, o.strategy);
  if (!layout.ok()) Invalid(layout.status());
  int n = layout->total_bundles;
  if (!o.bundle_label_selectors.empty() && o.bundle_label_selectors.size() != 1 &&
      static_cast<int>(o.bundle_label_selectors.size()) != n) {
    Invalid(InvalidArgument("label_selector length (" + std::to_string(o.bundle_label_selectors.size()) +
                            ") must match the number of bundles (" + std::to_string(n) + ")"));
  }
  if (o.timeout_s >= 0 && o.timeout_s != o.timeout_s) Invalid(InvalidArgument("timeout_s is not a number"));

  internal::PlacementGroupSpec spec;
  spec.name = o.name;
  spec.strategy = o.strategy;
  spec.detached = o.detached;
  spec.slice_topology = o.topology;
  spec.slice_version = o.accelerator_version;
  spec.num_slices = o.num_slices;
  spec.chips_per_vm = o.chips_per_vm.value_or(0);
  spec.slice_timeout_ms = o.timeout_s < 0 ? -1 : static_cast<int64_t>(o.timeout_s * 1000);
  std::unordered_map<std::string, double> res = o.resources_per_bundle;
  if (res.empty()) res["CPU"] = 1;
  res["TPU"] = layout->tpu_per_bundle;
  auto gen = NormalizeVersion(o.accelerator_version);
  std::string accel = AcceleratorTypeValue(*gen);
  std::map<std::string, std::string> slice_pins;  // slice index -> named slice (consistency)
  for (int i = 0; i < n; ++i) {
    auto b = res;
    auto loc = LocateBundle(*shape, *layout, i);
    // The slice's head unit goes with host 0's first bundle, so Ray-style head probes cannot
    // take a reserved slice.
    if (i % layout->bundles_per_slice == 0) b["TPU-" + shape->pod_type + "-head"] = 1;
    spec.bundles.push_back(b);
    internal::LabelSelector sel;
    if (!o.bundle_label_selectors.empty()) {
      const auto& user = o.bundle_label_selectors.size() == 1 ? o.bundle_label_selectors[0]
                                                              : o.bundle_label_selectors[i];
      sel = UserBundleSelector(user, loc.slice_index, &slice_pins);
    }
    // Implicit: every bundle selects the pod type and accelerator type.
    sel[std::string(kLabelPodType)] = shape->pod_type;
    sel[std::string(kLabelAcceleratorType)] = accel;
    spec.bundle_selectors.push_back(sel);
  }
  std::string id = internal::RequireRuntime().CreatePlacementGroup(spec);
  auto st = std::make_shared<SlicePlacementGroup::State>();
  st->id = id;
  st->detached = o.detached;
  st->num_bundles = n;
  st->hosts = shape->hosts * o.num_slices;
  st->chips_per_host = shape->chips_per_host;
  st->pod_type = shape->pod_type;
  st->options.name = o.name;
  st->options.bundles = spec.bundles;
  st->options.strategy = PlacementStrategy::SPREAD;
  st->options.detached = o.detached;
  return SlicePlacementGroup(st);
}

namespace {
const SlicePlacementGroup::State& Need(const std::shared_ptr<SlicePlacementGroup::State>& s) {
  if (!s) throw internal::RayException("Released: empty SlicePlacementGroup handle");
  return *s;
}
void NeedLive(const std::shared_ptr<SlicePlacementGroup::State>& s) {
  if (!s) throw internal::RayException("Released: empty SlicePlacementGroup handle");
  std::lock_guard<std::mutex> lock(s->mu);
  if (s->removed) {
    throw internal::RayException("Released: slice reservation " + s->id + " was removed");
  }
}
}  // namespace

bool SlicePlacementGroup::Wait(double timeout_s) const {
  NeedLive(state_);
  return internal::RequireRuntime().WaitPlacementGroup(state_->id, static_cast<int>(timeout_s + 0.999));
}

PlacementGroup SlicePlacementGroup::GetPlacementGroup() const {
  NeedLive(state_);
  PlacementGroup pg(state_->id, state_->options, PlacementGroupState::UNRECOGNIZED);
  pg.SetWaitCallback([](const std::string& id, int timeout) {
    return internal::RequireRuntime().WaitPlacementGroup(id, timeout);
  });
  return pg;
}

int SlicePlacementGroup::NumHosts() const { return Need(state_).hosts; }
int SlicePlacementGroup::ChipsPerHost() const { return Need(state_).chips_per_host; }
int SlicePlacementGroup::NumBundles() const { return Need(state_).num_bundles; }
std::string SlicePlacementGroup::PodType() const { return Need(state_).pod_type; }

std::vector<std::string> SlicePlacementGroup::SliceNames() const {
  NeedLive(state_);
  return internal::RequireRuntime().GetPlacementGroupInfo(state_->id, "").slice_names;
}

int SlicePlacementGroup::Epoch() const {
  NeedLive(state_);
  return internal::RequireRuntime().GetPlacementGroupInfo(state_->id, "").epoch;
}

void SlicePlacementGroup::Remove() {
  if (!state_) return;
  {
    std::lock_guard<std::mutex> lock(state_->mu);
    if (state_->removed) return;
    state_->removed = true;
  }
  if (auto* rt = internal::GetRuntime()) rt->RemovePlacementGroup(state_->id);
}

int GetNumIntactSlices(const std::string& topology, const std::string& version,
                       std::optional<int> chips_per_vm) {
  return internal::RequireRuntime().QuerySlices(topology, version, chips_per_vm.value_or(0), "").intact;
}

int GetNumReadySlices(const std::string& topology, const std::string& version,
                      std::optional<int> chips_per_vm) {
  return internal::RequireRuntime().QuerySlices(topology, version, chips_per_vm.value_or(0), "").ready;
}

std::vector<std::string> GetSliceNodes(const std::string& slice_name) {
  return internal::RequireRuntime().QuerySlices("", "", 0, slice_name).node_ids;
}

}  // namespace torus::tpu
