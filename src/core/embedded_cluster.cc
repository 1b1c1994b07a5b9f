#include "core/embedded_cluster.h"

#include "torus/api/exceptions.h"

namespace torus::core {

namespace {
// Constant-initialised (zero) before any dynamic initialiser runs, so registration order between
// translation units does not matter.
EmbeddedClusterStarter g_starter = nullptr;
}  // namespace

void SetEmbeddedClusterStarter(EmbeddedClusterStarter starter) { g_starter = starter; }

std::unique_ptr<EmbeddedCluster> StartEmbeddedCluster(const EmbeddedClusterOptions& options) {
  if (!g_starter) {
    throw internal::RayException(
        "no address given and this build has no embedded cluster: set TORUS_ADDRESS or "
        "RayConfig::address");
  }
  return g_starter(options);
}

}  // namespace torus::core
