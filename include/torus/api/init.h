// Starting and stopping the runtime in this process. Implemented by the core library.
#pragma once

#include <string>

#include "torus/api/config.h"

namespace torus {

// Connects this process to a cluster (config.address, else RAY_ADDRESS, else a new local one)
// and starts its runtime. Command-line flags in argv, when given, override fields of config.
// Must be called before any other API function except IsInitialized. Throws RayException when
// the cluster cannot be reached.
void Init();
void Init(RayConfig& config);
void Init(RayConfig& config, int argc, char** argv);

bool IsInitialized();

// Stops the runtime: references held afterwards are no longer counted, and the API functions
// throw until the next Init. Safe to call when not initialized.
void Shutdown();

// The namespace of this job (RayConfig::ray_namespace, or the generated one).
std::string GetNamespace();

}  // namespace torus
