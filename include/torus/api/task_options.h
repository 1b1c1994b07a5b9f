// Checks shared by the option setters of tasks, actors and actor calls.
#pragma once

#include <cmath>
#include <string>
#include <unordered_map>

#include "torus/api/exceptions.h"

namespace torus::internal {

// Throws RayException unless every resource has a name and a positive, finite amount that is a
// whole number when above 1 (fractions of one unit can be shared; several units cannot).
inline void ValidateResources(const std::unordered_map<std::string, double>& resources) {
  for (const auto& [name, amount] : resources) {
    const std::string shown = "'" + name + "' = " + std::to_string(amount);
    if (name.empty()) throw RayException("resource with an empty name (" + shown + ")");
    if (!std::isfinite(amount) || amount <= 0) {
      throw RayException("resource amounts must be positive, got " + shown);
    }
    if (amount > 1 && std::floor(amount) != amount) {
      throw RayException("resource amounts above 1 must be whole numbers, got " + shown);
    }
  }
}

// Throws RayException unless `count` is -1 (no limit) or non-negative.
inline void ValidateRetryCount(const char* what, int count) {
  if (count < -1) {
    throw RayException(std::string(what) + " must be -1 (no limit) or at least 0, got " +
                       std::to_string(count));
  }
}

}  // namespace torus::internal
