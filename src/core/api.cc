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
#include "core/embedded_cluster.h"
#include "core/ray_flags.h"
#include "core/worker_main.h"
#include "torus/api.h"

namespace torus {

namespace {

// Process-wide runtime state; guarded by g_mu.
struct Global {
  std::unique_ptr<core::EmbeddedCluster> embedded;  // embedded cluster only
  std::unique_ptr<core::CoreWorker> core;
};
std::mutex g_mu;
Global* g = new Global();  // never destroyed: usable from atexit handlers
std::atomic<internal::Runtime*> g_runtime{nullptr};

void StopEmbedded() {
  if (g->embedded) g->embedded->Stop();
  g->embedded.reset();
}

void ShutdownAtExit() { Shutdown(); }

}  // namespace

namespace internal {
RefCollector*& ActiveRefCollector() {
  thread_local RefCollector* active = nullptr;
  return active;
}
RefCollector*& ResultRefCollector() {
  thread_local RefCollector* result = nullptr;
  return result;
}
Runtime* GetRuntime() { return g_runtime.load(std::memory_order_acquire); }
Runtime& RequireRuntime() {
  Runtime* r = GetRuntime();
  if (!r) throw RayException("ray::Init() has not been called (or ray::Shutdown() already was)");
  return *r;
}

void ValidateResources(const std::unordered_map<std::string, double>& resources) {
  auto s = ValidateResourceRequest(ResourceMap(resources.begin(), resources.end()), "resources");
  if (!s.ok()) throw RayException(s.message());
}

void ValidateBundles(const std::vector<std::unordered_map<std::string, double>>& bundles) {
  for (size_t i = 0; i < bundles.size(); ++i) {
    auto s = ValidateResourceRequest(ResourceMap(bundles[i].begin(), bundles[i].end()),
                                     "placement group bundle " + std::to_string(i));
    if (!s.ok()) throw RayException(s.message());
  }
}
}  // namespace internal

namespace {

// Starts the embedded default cluster (a private head and node inside this process) and sets
// *address and *token. Throws RayException; requires g_mu.
void StartEmbedded(const RayConfig& config, const core::RayFlags& flags, std::string* address,
                   std::string* token) {
  g->embedded = core::StartEmbeddedCluster({config.head_args, flags.logs_dir});
  *address = g->embedded->head_address();
  *token = g->embedded->token();
}

// The address of a live node of the cluster at `address` on this host (or any live node).
std::string FindNodeToAttach(const std::string& address, const std::string& token) {
  auto stub = rpc::Head::NewStub(GetChannel(address));
  rpc::ListReply reply;
  auto ctx = NewContext(token, 10000);
  auto st = stub->List(ctx.get(), rpc::Empty(), &reply);
  if (!st.ok()) {
    throw internal::RayException("cannot reach the Torus head at " + address + ": " +
                                 st.error_message());
  }
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string node_address;
  for (const auto& n : reply.nodes()) {
    if (!n.alive()) continue;
    if (node_address.empty() || n.hostname() == host) node_address = n.address();
    if (n.hostname() == host) break;
  }
  if (node_address.empty()) {
    throw internal::RayException("the cluster at " + address + " has no live node to attach to");
  }
  return node_address;
}

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
  std::lock_guard<std::mutex> lock(g_mu);
  if (g->core) throw internal::RayException("ray::Init() was already called in this process");
  std::string address = config.address.empty() ? AddressFromEnv() : config.address;
  CheckConfig(config, flags, !address.empty());
  core::CoreWorkerOptions opts;
  if (config.runtime_env) {
    opts.job_env_vars = internal::EnvVarsOfSerialized(config.runtime_env->Serialize());
  }
  opts.default_detached = config.default_actor_lifetime == ActorLifetime::DETACHED;
  SetLogComponent("driver");
  SetDefaultLogLevel(LogLevel::WARNING);
  std::string token;
  if (address.empty()) {
    StartEmbedded(config, flags, &address, &token);
  } else {
    auto tok = FindToken();
    if (!tok.ok()) throw internal::RayException(tok.status().ToString());
    token = *tok;
  }
  opts.is_driver = true;
  opts.node_address =
      g->embedded ? g->embedded->node_address() : FindNodeToAttach(address, token);
  opts.head_address = address;
  opts.token = token;
  opts.job_id = RandomHex(4);
  opts.ray_namespace = config.ray_namespace.empty() ? RandomHex(8) : config.ray_namespace;
  opts.code_search_path = config.code_search_path;
  if (const char* b = std::getenv("TORUS_BIND_HOST"); b && *b) opts.bind_host = b;
  auto cw = core::CoreWorker::Create(opts);
  if (!cw.ok()) {
    StopEmbedded();
    throw internal::RayException("ray::Init failed: " + cw.status().ToString());
  }
  g->core = std::move(*cw);
  g_runtime.store(g->core.get(), std::memory_order_release);
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(ShutdownAtExit); });
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

void Shutdown() {
  std::lock_guard<std::mutex> lock(g_mu);
  g_runtime.store(nullptr, std::memory_order_release);
  if (g->core) {
    g->core->Shutdown();
    g->core.reset();
  }
  StopEmbedded();
}

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
  core::CoreWorkerOptions opts;
  opts.is_driver = false;
  opts.worker_id = env("TORUS_WORKER_ID");
  opts.node_address = env("TORUS_NODE_ADDRESS");
  opts.head_address = env("TORUS_HEAD_ADDRESS");
  opts.token = env("TORUS_TOKEN");
  opts.code_search_path = paths;
  if (!env("TORUS_BIND_HOST").empty()) opts.bind_host = env("TORUS_BIND_HOST");
  opts.on_ready = [](core::CoreWorker* w) { g_runtime.store(w, std::memory_order_release); };
  auto cw = core::CoreWorker::Create(opts);
  if (!cw.ok()) {
    TORUS_LOG(ERROR) << "worker cannot start: " << cw.status().ToString();
    _exit(1);
  }
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g->core = std::move(*cw);
    g_runtime.store(g->core.get(), std::memory_order_release);
  }
  g->core->CaptureOutput();
  g->core->RunWorkerLoop();
}

}  // namespace torus
