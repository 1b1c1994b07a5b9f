// Init/Shutdown and the process-level entry points of the API: joining a cluster, the embedded
// default cluster (head + node inside the driver process), and worker mode.
#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "common/ids.h"
#include "common/logging.h"
#include "common/process.h"
#include "common/resources.h"
#include "common/rpc.h"
#include "common/session.h"
#include "core/core_worker.h"
#include "core/process_runtime.h"
#include "core/ray_flags.h"
#include "core/worker_main.h"
#include "torus/api.h"

namespace torus {

namespace internal {
RefCollector*& ActiveRefCollector() {
  thread_local RefCollector* active = nullptr;
  return active;
}
RefCollector*& ResultRefCollector() {
  thread_local RefCollector* result = nullptr;
  return result;
}

void ValidateResources(const std::unordered_map<std::string, double>& resources) {
  auto s = ValidateResourceRequest(ResourceDoubles(resources.begin(), resources.end()), "resources");
  if (!s.ok()) throw RayException(s.message());
}

void ValidateBundles(const std::vector<std::unordered_map<std::string, double>>& bundles) {
  for (size_t i = 0; i < bundles.size(); ++i) {
    auto s = ValidateResourceRequest(ResourceDoubles(bundles[i].begin(), bundles[i].end()),
                                     "placement group bundle " + std::to_string(i));
    if (!s.ok()) throw RayException(s.message());
  }
}
}  // namespace internal

namespace {

// Checks what Init is given before anything starts; prints one line per setting Torus ignores.
void CheckConfig(const RayConfig& config, const core::RayFlags& flags, bool joining) {
  if (config.local_mode) {
    throw internal::RayException(
        "RayConfig::local_mode is not supported by Torus: tasks always run in worker "
        "processes. Leave it false: without an address, ray::Init() starts a private cluster "
        "on this machine, which Shutdown() stops");
  }
  std::vector<std::string> warnings = flags.warnings;
  if (config.redis_password_ || config.redis_username_) {
    warnings.push_back("torus: ignoring RayConfig::redis_username_/redis_password_: Torus has "
                       "no Redis; clients authenticate with the session token");
  }
  if (joining && !config.head_args.empty()) {
    warnings.push_back("torus: ignoring head_args (--ray_head_args): they apply only to the "
                       "cluster ray::Init() starts itself, and this driver joins one");
  }
  if (joining && !flags.logs_dir.empty()) {
    warnings.push_back("torus: ignoring --ray_logs_dir: it applies only to the cluster "
                       "ray::Init() starts itself; workers of a joined cluster log to its session");
  }
  for (const auto& w : warnings) std::fprintf(stderr, "%s\n", w.c_str());
}

void InitWith(RayConfig& config, const core::RayFlags& flags) {
  if (std::getenv("TORUS_WORKER_MODE")) RunWorkerMain();  // never returns
  if (internal::GetRuntime()) {
    throw internal::RayException("ray::Init() was already called in this process");
  }
  core::DriverOptions o;
  o.address = config.address;
  CheckConfig(config, flags, !(o.address.empty() ? AddressFromEnv() : o.address).empty());
  if (config.runtime_env) o.job_env_vars = internal::EnvVarsOfSerialized(config.runtime_env->Serialize());
  o.default_detached = config.default_actor_lifetime == ActorLifetime::DETACHED;
  o.ray_namespace = config.ray_namespace;
  o.code_search_path = config.code_search_path;
  o.head_args = config.head_args;
  o.logs_dir = flags.logs_dir;
  core::InitDriver(o);
}

}  // namespace

void Init() {
  RayConfig config;
  Init(config);
}

void Init(RayConfig& config, int argc, char** argv) {
  if (std::getenv("TORUS_WORKER_MODE")) RunWorkerMain();  // never returns
  core::RayFlags flags = core::ParseRayFlags(config, argc, argv);
  InitWith(config, flags);
}

void Init(RayConfig& config) { InitWith(config, core::RayFlags{}); }

bool IsInitialized() { return internal::GetRuntime() != nullptr; }

void Shutdown() { core::ShutdownDriver(); }

std::string GetNamespace() { return internal::RequireRuntime().GetNamespace(); }

void ExitActor() { internal::RequireRuntime().ExitActor(); }

bool WasCurrentActorRestarted() { return internal::RequireRuntime().WasCurrentActorRestarted(); }

namespace {
const char* StrategyName(PlacementStrategy s) {
  switch (s) {
    case PlacementStrategy::PACK: return "PACK";
    case PlacementStrategy::SPREAD: return "SPREAD";
    case PlacementStrategy::STRICT_PACK: return "STRICT_PACK";
    case PlacementStrategy::STRICT_SPREAD: return "STRICT_SPREAD";
    default: return "UNRECOGNIZED";
  }
}
PlacementStrategy StrategyOf(const std::string& s) {
  if (s == "PACK") return PlacementStrategy::PACK;
  if (s == "SPREAD") return PlacementStrategy::SPREAD;
  if (s == "STRICT_PACK") return PlacementStrategy::STRICT_PACK;
  if (s == "STRICT_SPREAD") return PlacementStrategy::STRICT_SPREAD;
  return PlacementStrategy::UNRECOGNIZED;
}
PlacementGroupState StateOf(const std::string& s) {
  if (s == "PENDING") return PlacementGroupState::PENDING;
  if (s == "CREATED") return PlacementGroupState::CREATED;
  if (s == "REMOVED") return PlacementGroupState::REMOVED;
  if (s == "RESCHEDULING") return PlacementGroupState::RESCHEDULING;
  return PlacementGroupState::UNRECOGNIZED;
}
PlacementGroup Wrap(const internal::PlacementGroupInfo& info) {
  if (!info.found) return PlacementGroup();
  PlacementGroupCreationOptions o;
  o.name = info.spec.name;
  o.bundles = info.spec.bundles;
  o.strategy = StrategyOf(info.spec.strategy);
  o.detached = info.spec.detached;
  bool any_selector = false;
  for (const auto& s : info.spec.bundle_selectors) any_selector = any_selector || !s.empty();
  if (any_selector) o.bundle_label_selectors = info.spec.bundle_selectors;
  PlacementGroup pg(info.id, o, StateOf(info.state));
  pg.SetWaitCallback([](const std::string& id, int timeout) {
    return internal::RequireRuntime().WaitPlacementGroup(id, timeout);
  });
  return pg;
}
}  // namespace

PlacementGroup CreatePlacementGroup(const PlacementGroupCreationOptions& options) {
  internal::ValidateBundles(options.bundles);
  internal::PlacementGroupSpec spec;
  spec.name = options.name;
  spec.bundles = options.bundles;
  spec.strategy = StrategyName(options.strategy);
  spec.bundle_selectors = options.bundle_label_selectors;
  spec.detached = options.detached;
  std::string id = internal::RequireRuntime().CreatePlacementGroup(spec);
  PlacementGroup pg(id, options, PlacementGroupState::PENDING);
  pg.SetWaitCallback([](const std::string& pid, int timeout) {
    return internal::RequireRuntime().WaitPlacementGroup(pid, timeout);
  });
  return pg;
}
void RemovePlacementGroup(const std::string& id) { internal::RequireRuntime().RemovePlacementGroup(id); }
std::vector<PlacementGroup> GetAllPlacementGroups() {
  std::vector<PlacementGroup> out;
  for (const auto& info : internal::RequireRuntime().GetAllPlacementGroups()) out.push_back(Wrap(info));
  return out;
}
PlacementGroup GetPlacementGroupById(const std::string& id) {
  return Wrap(internal::RequireRuntime().GetPlacementGroupInfo(id, ""));
}
PlacementGroup GetPlacementGroup(const std::string& name) {
  return Wrap(internal::RequireRuntime().GetPlacementGroupInfo("", name));
}

// ------------------------------------------------------------------------------- worker mode

[[noreturn]] void RunWorkerMain() {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  SetLogComponent("worker");
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    return std::string(v ? v : "");
  };
  // Shared libraries of the code search path register their functions when loaded.
  std::string code = env("TORUS_CODE_SEARCH_PATH");
  std::vector<std::string> paths;
  size_t start = 0;
  while (start < code.size()) {
    size_t end = code.find(':', start);
    if (end == std::string::npos) end = code.size();
    if (end > start) paths.push_back(code.substr(start, end - start));
    start = end + 1;
  }
  for (const auto& p : paths) {
    namespace fs = std::filesystem;
    std::vector<std::string> libs;
    std::error_code ec;
    if (fs::is_directory(p, ec)) {
      for (const auto& e : fs::directory_iterator(p, ec)) {
        if (e.path().extension() == ".so") libs.push_back(e.path().string());
      }
    } else {
      libs.push_back(p);
    }
    for (const auto& l : libs) {
      if (!dlopen(l.c_str(), RTLD_NOW | RTLD_GLOBAL)) {
        TORUS_LOG(ERROR) << "cannot load " << l << " from the code search path: " << dlerror();
      }
    }
  }
  core::RunWorker(nullptr, paths);
}

}  // namespace torus
