// RayConfig: what ray::Init(config) is given. Field for field the same as Ray's public
// RayConfig, so Ray programs that fill it compile unchanged; the core library reads it in Init.
#pragma once

#include <string>
#include <vector>

#include <boost/optional.hpp>

#include "torus/api/runtime_env.h"

namespace torus {

// Whether an actor outlives the driver that created it.
enum class ActorLifetime {
  NON_DETACHED,  // dies with its owner
  DETACHED,      // lives until killed, ExitActor, or the cluster stops
};

class RayConfig {
 public:
  // Cluster to join, "host:port" of the head. Empty: the RAY_ADDRESS environment variable, and
  // when that is unset too, start a local cluster.
  std::string address = "";

  // Run every task in the driver process (for debugging).
  bool local_mode = false;

  // Directories or shared libraries holding the user's remote functions, for workers to load.
  std::vector<std::string> code_search_path;

  // Extra `start` arguments used when the driver starts the head itself.
  std::vector<std::string> head_args = {};

  // Lifetime of actors whose creator does not choose one.
  ActorLifetime default_actor_lifetime = ActorLifetime::NON_DETACHED;

  // Job-level runtime environment.
  boost::optional<RuntimeEnv> runtime_env;

  // Unstable, as in Ray: credentials of the head's metadata store, if it requires them.
  boost::optional<std::string> redis_username_;
  boost::optional<std::string> redis_password_;

  // Set by the worker launcher only; user code leaves it false.
  bool is_worker_ = false;

  // Namespace for named actors of this job. Empty: an anonymous namespace unique to the job.
  std::string ray_namespace = "";
};

}  // namespace torus
