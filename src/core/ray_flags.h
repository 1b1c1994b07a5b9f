// Ray's program flags (ray::Init(config, argc, argv)) and RayConfig fields that Torus maps onto
// its own concepts. Ray's set is the ABSL_FLAGs of its cpp/src/ray/config_internal.cc.
//
//   honoured:  --ray_address, --ray_namespace, --ray_code_search_path (':'-separated),
//              --ray_default_actor_lifetime (detached | non_detached, any case),
//              --ray_logs_dir (worker logs of the cluster the driver starts itself),
//              --ray_head_args (space-separated, appended to RayConfig::head_args)
//   warned:    --ray_redis_password (Torus authenticates with the session token), --ray_job_id,
//              --ray_node_ip_address, --ray_node_manager_port, --ray_raylet_socket_name,
//              --ray_plasma_store_socket_name, --ray_session_dir, --startup_token, and any
//              other --ray_* flag: one line each, naming the flag and why it is ignored
//
// Both `--flag=value` and `--flag value` are read, with one or two leading dashes (absl's
// forms). Arguments that are not Ray flags are left alone. Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "torus/api/config.h"

namespace torus::core {

struct RayFlags {
  std::string logs_dir;               // --ray_logs_dir; "" = the session's logs directory
  std::vector<std::string> warnings;  // one line per flag Torus ignores
};

// Reads Ray's flags from argv[1..argc) into `config` and the result. Throws
// internal::RayException naming the flag when a value is malformed.
RayFlags ParseRayFlags(RayConfig& config, int argc, char** argv);

}  // namespace torus::core
