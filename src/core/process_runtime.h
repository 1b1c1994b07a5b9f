// The core worker of this process, for the language front ends: the C++ API (api.cc: ray::Init,
// worker mode) and the Python binding (src/python). One per process: a driver's, started by
// InitDriver, or a worker's, started by RunWorker when a node spawned this process.
//
// Threading: InitDriver, ShutdownDriver and RunWorker serialise on one process lock; Current()
// may be called from any thread (it is the same pointer as internal::GetRuntime()).
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/executor.h"

namespace torus::core {

class CoreWorker;

struct DriverOptions {
  // The head "host:port"; "auto": the latest session's cluster on this machine; "": the
  // TORUS_ADDRESS / RAY_ADDRESS environment variables, and when both are unset a private cluster
  // started inside this process (stopped by ShutdownDriver).
  std::string address;
  // With no address from the options or the environment: join the latest session's cluster on
  // this machine when its head answers, before starting a private one (Python's ray.init()).
  bool join_running = false;
  std::string ray_namespace;  // "": a random one
  std::map<std::string, std::string> job_env_vars;
  bool default_detached = false;
  std::vector<std::string> code_search_path;
  std::vector<std::string> python_worker_command;  // see CoreWorkerOptions
  // Idle Python workers the driver's node keeps ready for this job (CoreWorkerOptions); -1:
  // TORUS_PRESTART_WORKERS, default 3 for a Python driver, none when Ray's
  // RAY_prestart_worker_first_driver is 0 or false.
  int warm_workers = -1;
  std::vector<std::string> head_args;  // the private cluster's node flags
  std::string logs_dir;                // the private cluster's logs directory
  std::string log_component = "driver";
};

// Connects this process as a driver. Throws internal::RayException naming what failed (already
// initialized, no cluster at the address, no token...); nothing is left running then.
void InitDriver(const DriverOptions& options);
// Finishes the job, stops the core worker and the private cluster if one was started. Idempotent.
void ShutdownDriver();
// The private cluster's head address ("" when none).
std::string EmbeddedHeadAddress();

// Worker processes (TORUS_WORKER_MODE): connects to the node that spawned this process and serves
// tasks with the executor `make_executor` returns (null: the C++ one). Never returns.
[[noreturn]] void RunWorker(std::function<std::unique_ptr<Executor>()> make_executor,
                            std::vector<std::string> code_search_path = {});

// This process's core worker, or nullptr before InitDriver / RunWorker and after ShutdownDriver.
CoreWorker* Current();

}  // namespace torus::core
