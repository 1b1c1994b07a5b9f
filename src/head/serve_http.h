// Ray Serve's REST API on the head's HTTP server (the calls KubeRay's RayService and
// `serve deploy` make on the dashboard port, Ray 2.60), behind the cluster token:
//
//   PUT    /api/serve/applications/   Serve's declarative config (ServeDeploySchema JSON):
//                                     validated, stored, Serve started if no controller is; 200
//                                     with an empty body (400 naming what is wrong)
//   GET    /api/serve/applications/   ServeInstanceDetails: what the controller last wrote, or
//                                     the empty details when no controller is alive;
//                                     ?api_type=declarative|imperative keeps the applications
//                                     of that source (KubeRay asks for declarative ones)
//   DELETE /api/serve/applications/   shuts Serve down; 200 once the controller is gone (as
//                                     Ray's, which waits for serve.shutdown()), at most 30 s
// (also without the trailing slash: routes match path segments). docs/http.md lists them.
//
// The head does not run Serve: it hands the config to the Serve controller (a Python actor,
// python/torus/serve/_private/controller.py) through the head's KV store. The contract, all in
// namespace "serve":
//   deploy_config          the config of the last PUT as normalized JSON text (sorted keys,
//                          compact); a DELETE stores {"_shutdown": true, "applications": []}
//   deploy_config_version  decimal text, +1 on every PUT and DELETE; written after
//                          deploy_config, so a controller that sees a new version reads a config
//                          at least that new
//   details                ServeInstanceDetails JSON, written by the controller
//   metrics                Prometheus text of Serve's metrics (Ray's names), written by the
//                          controller; the head's /metrics appends what FilterServeMetrics
//                          keeps of it (head/serve_metrics.h) while a controller is live
// When a PUT finds no live controller (actor SERVE_CONTROLLER_ACTOR in namespace "serve", not
// DEAD) and no bootstrap job PENDING or RUNNING, it submits one: the job runs
// `<python> -m torus.serve._private.rest_bootstrap` (python: $TORUS_SERVE_PYTHON of the head,
// else python3 from PATH), which starts the controller; the controller then polls the version.
//
// THREADS: ServeApi's methods may be called from any thread (the HTTP server's handlers). One
// mutex serialises the writers (PUT, DELETE), so each version is bumped once and at most one
// bootstrap job is started per PUT that needs it. A DELETE holds it while it waits for the
// controller to go (polling, bounded), so a PUT after a DELETE starts Serve anew instead of
// handing its config to a controller on its way out. GET and Metrics take no lock of ours.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/http_server.h"
#include "common/status.h"
#include "common/thread_annotations.h"
#include "head/kv_store.h"

namespace torus {

class ActorDirectory;
class JobManager;

inline constexpr const char* kServeNamespace = "serve";
inline constexpr const char* kServeControllerName = "SERVE_CONTROLLER_ACTOR";

// What the Serve API needs from the head besides the KV store: the controller's liveness and
// the bootstrap job. The head's is MakeHeadServeRuntime; tests give a fake.
class ServeRuntime {
 public:
  virtual ~ServeRuntime() = default;
  // Whether the actor SERVE_CONTROLLER_ACTOR of namespace "serve" exists and is not DEAD.
  virtual bool ControllerLive() = 0;
  // Whether a bootstrap job (one StartBootstrap submitted, also by an earlier head whose jobs
  // this one resumed) is PENDING or RUNNING.
  virtual bool BootstrapRunning() = 0;
  // Submits the bootstrap job, `shell_command` run by /bin/sh -c on the driver's node.
  virtual Status StartBootstrap(const std::string& shell_command) = 0;
  // Whether the head is stopping (waits end early).
  virtual bool Stopping() = 0;
};

// The head's runtime: actors from `actors`, jobs from `jobs` (bootstrap jobs carry the metadata
// torus.serve=rest_bootstrap and are named serve-bootstrap-<hex>), `stopping` the head's flag.
// All outlive it.
std::unique_ptr<ServeRuntime> MakeHeadServeRuntime(ActorDirectory& actors, JobManager& jobs,
                                                   const std::atomic<bool>& stopping);

// The body of a PUT checked as Ray's ServeDeploySchema would on the points the head relies on:
// a JSON object (ParseJson's depth limit) with no top-level key starting with '_' (the head's
// markers); `applications` absent or a list of objects, each with an `import_path` of the form
// "module:attribute" or "module.attribute", a string `name` (default "default") unique among
// them, a `route_prefix` null or a string starting with '/' (not ending in '/' unless "/"),
// unique when set, and `args`/`runtime_env` objects and `deployments` a list of objects when
// given. Returns the normalized JSON text, or InvalidArgument naming the first problem (e.g.
// `applications[1].import_path must be a non-empty string "module:attribute"`).
StatusOr<std::string> ValidateServeDeployConfig(std::string_view body);

// The bootstrap job's command line for `python` ("" = python3, found on PATH when it runs),
// shell-quoted when it needs to be.
std::string ServeBootstrapCommand(std::string_view python);

// ServeInstanceDetails when Serve is not running.
extern const char* const kServeEmptyDetails;

class ServeApi {
 public:
  // `kv` outlives this. `bootstrap_command` as ServeBootstrapCommand gives it. `shutdown_wait`:
  // how long a DELETE waits for the controller to go (Ray's serve.shutdown waits 30 s).
  ServeApi(KvStore& kv, std::unique_ptr<ServeRuntime> runtime, std::string bootstrap_command,
           std::chrono::milliseconds shutdown_wait = std::chrono::seconds(30));
  ServeApi(const ServeApi&) = delete;
  ServeApi& operator=(const ServeApi&) = delete;

  // PUT: validates `body` (InvalidArgument), stores it and bumps the version, then starts the
  // bootstrap job when neither a controller nor a bootstrap job is alive. An error starting the
  // job is returned (the config stays stored; the next PUT tries again).
  Status Deploy(std::string_view body) EXCLUDES(mu_);
  // DELETE: stores the shutdown config, bumps the version, then waits until no controller is
  // live (or shutdown_wait passed: logged, still OK; or the head stops).
  Status Shutdown() EXCLUDES(mu_);
  // GET: the controller's details (kServeEmptyDetails without a live controller or details).
  // A non-empty `api_type` ("declarative" or "imperative", any case; else InvalidArgument)
  // keeps only the applications whose "source" it is.
  StatusOr<std::string> Details(std::string_view api_type = "");
  // For the head's /metrics: what FilterServeMetrics keeps of the controller's `metrics` text,
  // each line ending in '\n'; "" without a live controller (a controller gone leaves its last
  // text behind, which is no longer Serve's state) or without the key. A refused value or
  // dropped lines are logged once, until a clean value comes.
  std::string Metrics();

 private:
  // Stores `config` as deploy_config, then deploy_config_version + 1.
  Status StoreLocked(std::string config) REQUIRES(mu_);

  // constant after construction
  KvStore& kv_;
  std::unique_ptr<ServeRuntime> runtime_;
  const std::string bootstrap_command_;
  const std::chrono::milliseconds shutdown_wait_;

  Mutex mu_;  // the writers: one PUT or DELETE at a time
  std::atomic<bool> metrics_warned_{false};  // Metrics logged a problem since the last clean value
};

// Registers the routes above on `server` (before its Start); every one needs the token.
// `api` outlives the server's serving.
void RegisterServeHttp(HttpServer& server, ServeApi& api);

}  // namespace torus
