// The embedded default cluster as the driver API sees it: ray::Init() without an address starts a
// private head and node inside the driver process. core/ does not depend on head/ or node/: the
// embedded/ layer above them (src/embedded/local_cluster.cc) registers the starter while
// libtorus.so loads, and Init() calls it through StartEmbeddedCluster.
//
// Threading: SetEmbeddedClusterStarter runs during static initialisation, before main;
// StartEmbeddedCluster and the EmbeddedCluster methods are called by Init()/Shutdown() under the
// API's process lock (api.cc g_mu), one at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace torus::core {

struct EmbeddedClusterOptions {
  std::vector<std::string> head_args;  // RayConfig::head_args, applied to the node
  std::string logs_dir;                // --ray_logs_dir; "" = the session's logs directory
};

class EmbeddedCluster {
 public:
  virtual ~EmbeddedCluster() = default;
  virtual const std::string& head_address() const = 0;
  virtual const std::string& node_address() const = 0;
  virtual const std::string& token() const = 0;
  // Stops the node, then the head, and removes the session directory (unless TORUS_KEEP_SESSION).
  // Idempotent; the destructor calls it.
  virtual void Stop() = 0;
};

// Starts a cluster or throws internal::RayException naming what failed; nothing is left running
// or on disk when it throws.
using EmbeddedClusterStarter = std::unique_ptr<EmbeddedCluster> (*)(const EmbeddedClusterOptions&);

void SetEmbeddedClusterStarter(EmbeddedClusterStarter starter);

// Throws internal::RayException when no starter is registered or it fails.
std::unique_ptr<EmbeddedCluster> StartEmbeddedCluster(const EmbeddedClusterOptions& options);

}  // namespace torus::core
