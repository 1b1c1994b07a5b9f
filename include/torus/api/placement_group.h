// Placement groups: reserved bundles of resources that tasks and actors can be placed into.
// The types match Ray's; CreatePlacementGroup and the lookups are implemented by the core
// library. A PlacementGroup is a value (id, creation options, last known state) plus the
// runtime's wait hook; copying it does not copy the reservation.
#pragma once

#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "torus/api/exceptions.h"

namespace torus {

enum class PlacementStrategy {
  PACK = 0,           // as few nodes as possible, best effort
  SPREAD = 1,         // as many nodes as possible, best effort
  STRICT_PACK = 2,    // all bundles on one node
  STRICT_SPREAD = 3,  // every bundle on a different node
  UNRECOGNIZED = -1
};

// Unscoped, as in Ray, so both ray::PlacementGroupState::CREATED and ray::CREATED compile.
enum PlacementGroupState {
  PENDING = 0,
  PREPARED = 1,
  CREATED = 2,
  REMOVED = 3,
  RESCHEDULING = 4,
  UNRECOGNIZED = -1,
};

// An aggregate, so Ray's `PlacementGroupCreationOptions{name, bundles, strategy}` works.
struct PlacementGroupCreationOptions {
  std::string name;  // empty: anonymous
  std::vector<std::unordered_map<std::string, double>> bundles;
  PlacementStrategy strategy = PlacementStrategy::PACK;
  // Torus extension: bundle_label_selectors[i] constrains the node of bundles[i] (Ray label
  // selector syntax, see internal::LabelSelector). Empty, or one entry per bundle.
  std::vector<std::unordered_map<std::string, std::string>> bundle_label_selectors = {};
  // Torus extension: the group outlives the job that created it.
  bool detached = false;
};

class PlacementGroup {
 public:
  // Waits up to timeout_seconds for the group (by id) to be created; true when it is.
  using WaitCallback = std::function<bool(const std::string& id, int timeout_seconds)>;

  PlacementGroup() = default;
  PlacementGroup(std::string id, PlacementGroupCreationOptions options,
                 PlacementGroupState state = PlacementGroupState::UNRECOGNIZED)
      : id_(std::move(id)), options_(std::move(options)), state_(state) {}

  // Empty when this names no group (e.g. GetPlacementGroup found none).
  std::string GetID() const { return id_; }
  std::string GetName() const { return options_.name; }
  std::vector<std::unordered_map<std::string, double>> GetBundles() const {
    return options_.bundles;
  }
  // The state when this value was made; it is not refreshed.
  PlacementGroupState GetState() const { return state_; }
  PlacementStrategy GetStrategy() const { return options_.strategy; }
  const PlacementGroupCreationOptions& GetOptions() const { return options_; }
  bool Empty() const { return id_.empty(); }

  // Blocks up to timeout_seconds until the group is created. Returns false on timeout.
  // Throws RayException when this value did not come from the runtime (no wait hook).
  bool Wait(int timeout_seconds) const {
    if (!wait_callback_) {
      throw internal::RayException("PlacementGroup::Wait: placement group '" + id_ +
                                   "' was not obtained from the runtime");
    }
    return wait_callback_(id_, timeout_seconds);
  }

  // Installed by the runtime on the values it hands out.
  void SetWaitCallback(WaitCallback callback) { wait_callback_ = std::move(callback); }
  // Ray's spelling of the same.
  void SetWaitCallbak(WaitCallback callback) { SetWaitCallback(std::move(callback)); }

 private:
  std::string id_;
  PlacementGroupCreationOptions options_;
  PlacementGroupState state_ = PlacementGroupState::UNRECOGNIZED;
  WaitCallback wait_callback_;
};

// Implemented by the core library. All require Init() and throw internal::RayException on
// failure (e.g. a name already in use, a bundle no node can ever hold).
PlacementGroup CreatePlacementGroup(const PlacementGroupCreationOptions& create_options);
void RemovePlacementGroup(const std::string& placement_group_id);
std::vector<PlacementGroup> GetAllPlacementGroups();
// An empty PlacementGroup (GetID() == "") when none matches.
PlacementGroup GetPlacementGroupById(const std::string& id);
PlacementGroup GetPlacementGroup(const std::string& name);

}  // namespace torus
