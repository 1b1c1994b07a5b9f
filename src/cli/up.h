// `torus up FILE.yaml`, `torus down` and the launcher's supervisor (`torus supervise`, started by
// `up`): a whole local cluster from a KubeRay RayCluster manifest. Design: docs/launcher.md.
#pragma once

#include <string>

namespace torus {

// Runs `cmd` ("up", "down" or "supervise") with the command line of `torus` (argv[1] == cmd).
// Returns the process exit code.
int RunLauncherCommand(const std::string& cmd, int argc, char** argv);

}  // namespace torus
