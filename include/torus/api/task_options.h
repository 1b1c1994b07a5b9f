// Checks shared by the option setters of tasks, actors and actor calls.
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "torus/api/exceptions.h"

namespace torus::internal {

// Throws RayException unless every resource has a name and a positive, finite amount of at most
// 1e9 (1 PiB for "memory") that is a whole number when above 1 (fractions of one unit can be
// shared; several units cannot). Implemented by the core library with the runtime's one rule
// for resource amounts, which the node and head apply again to what they receive.
void ValidateResources(const std::unordered_map<std::string, double>& resources);

// The same for each bundle of a placement group; the message names the bundle's index.
void ValidateBundles(const std::vector<std::unordered_map<std::string, double>>& bundles);

// Throws RayException unless `count` is -1 (no limit) or non-negative.
inline void ValidateRetryCount(const char* what, int count) {
  if (count < -1) {
    throw RayException(std::string(what) + " must be -1 (no limit) or at least 0, got " +
                       std::to_string(count));
  }
}

}  // namespace torus::internal
