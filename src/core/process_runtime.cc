#include "core/process_runtime.h"

#include "common/head_addresses.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>

#include "common/ids.h"
#include "common/logging.h"
#include "common/rpc.h"
#include "common/session.h"
#include "common/text.h"
#include "core/core_worker.h"
#include "core/embedded_cluster.h"
#include "torus/api/exceptions.h"

namespace torus {
namespace internal {
// The API's view of the runtime (runtime.h); set and cleared here only.
std::atomic<Runtime*>& RuntimeSlot() {
  static std::atomic<Runtime*> slot{nullptr};
  return slot;
}
Runtime* GetRuntime() { return RuntimeSlot().load(std::memory_order_acquire); }
Runtime& RequireRuntime() {
  Runtime* r = GetRuntime();
  if (!r) throw RayException("ray::Init() has not been called (or ray::Shutdown() already was)");
  return *r;
}
}  // namespace internal

namespace core {
namespace {

// Process-wide runtime state; guarded by g_mu.
struct Global {
  std::unique_ptr<EmbeddedCluster> embedded;  // private cluster only
  std::unique_ptr<CoreWorker> core;
};
std::mutex g_mu;
Global* g = new Global();  // never destroyed: usable from atexit handlers

void Publish(CoreWorker* w) { internal::RuntimeSlot().store(w, std::memory_order_release); }

void StopEmbedded() {
  if (g->embedded) g->embedded->Stop();
  g->embedded.reset();
}

void ShutdownAtExit() { ShutdownDriver(); }

// "auto": the head of the latest session on this machine.
std::string AutoAddress() {
  auto addr = LatestHeadAddress();
  if (!addr.ok() || addr->empty()) {
    throw internal::RayException(
        "address=\"auto\": no running Torus cluster found on this machine (" +
        (addr.ok() ? "no session with a head under " + SessionRoot() : addr.status().message()) +
        "); start one with `torus start --head` or leave the address empty for a private cluster");
  }
  return *addr;
}

// The latest session's head when it answers with its token, else "".
std::string RunningAddress() {
  auto address = LatestHeadAddress();
  if (!address.ok() || address->empty()) return "";
  auto tok = FindToken();
  if (!tok.ok()) return "";
  auto stub = rpc::Head::NewStub(GetChannel(*address));
  rpc::ListReply reply;
  auto ctx = NewContext(*tok, 2000);
  return stub->List(ctx.get(), rpc::Empty(), &reply).ok() ? *address : "";
}

// The address of a live node of the cluster at `address`: the head's own node when it is on this
// host, else another node of this host, else any live node.
std::string FindNodeToAttach(const std::string& address, const std::string& token) {
  rpc::ListReply reply;
  grpc::Status st;
  for (const auto& head : HeadAddresses::Split(address)) {  // "A,B": a head and its standbys
    reply.Clear();
    auto ctx = NewContext(token, 10000);
    st = rpc::Head::NewStub(GetChannel(head))->List(ctx.get(), rpc::Empty(), &reply);
    if (st.error_code() != grpc::StatusCode::UNAVAILABLE) break;
  }
  if (!st.ok()) {
    throw internal::RayException("cannot reach the Torus head at " + address + ": " +
                                 st.error_message());
  }
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  std::string node_address;
  int rank = -1;  // 0: any node, 1: one of this host, 2: the head's node on this host
  for (const auto& n : reply.nodes()) {
    if (!n.alive()) continue;
    int r = n.hostname() != host ? 0 : n.is_head_node() ? 2 : 1;
    if (r > rank) {
      rank = r;
      node_address = n.address();
    }
  }
  if (node_address.empty()) {
    throw internal::RayException("the cluster at " + address + " has no live node to attach to");
  }
  return node_address;
}

// DriverOptions::warm_workers resolved: `given` when set, else the environment's, else 3 (a
// Serve application's controller, proxy and first replica; a program's first three tasks).
int WarmWorkers(int given) {
  if (given >= 0) return given;
  if (const char* ray = std::getenv("RAY_prestart_worker_first_driver"); ray) {
    std::string v = Lower(ray);
    if (v == "0" || v == "false") return 0;
  }
  if (const char* n = std::getenv("TORUS_PRESTART_WORKERS"); n && *n) {
    char* end = nullptr;
    long v = std::strtol(n, &end, 10);
    if (*end == '\0' && v >= 0) return static_cast<int>(std::min<long>(v, 1000));
    std::fprintf(stderr, "torus: ignoring TORUS_PRESTART_WORKERS=%s: not a count\n", n);
  }
  return 3;
}

}  // namespace

void InitDriver(const DriverOptions& o) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g->core) throw internal::RayException("ray::Init() was already called in this process");
  std::string address = o.address.empty() ? AddressFromEnv() : o.address;
  if (address.empty() && o.join_running) address = RunningAddress();
  if (address == "auto") address = AutoAddress();
  if (address.rfind("ray://", 0) == 0) {
    throw internal::RayException("address " + address +
                                 ": Ray Client (ray://) is not supported by Torus; give the "
                                 "head's host:port");
  }
  CoreWorkerOptions opts;
  opts.job_env_vars = o.job_env_vars;
  opts.default_detached = o.default_detached;
  SetLogComponent(o.log_component);
  SetDefaultLogLevel(LogLevel::WARNING);
  std::string token;
  if (address.empty() || address == "local") {
    g->embedded = StartEmbeddedCluster({o.head_args, o.logs_dir});
    address = g->embedded->head_address();
    token = g->embedded->token();
  } else {
    auto tok = FindToken();
    if (!tok.ok()) throw internal::RayException(tok.status().ToString());
    token = *tok;
  }
  opts.is_driver = true;
  try {
    opts.node_address = g->embedded ? g->embedded->node_address() : FindNodeToAttach(address, token);
  } catch (...) {
    StopEmbedded();
    throw;
  }
  opts.head_address = address;
  opts.token = token;
  opts.job_id = RandomHex(4);
  opts.ray_namespace = o.ray_namespace.empty() ? RandomHex(8) : o.ray_namespace;
  opts.code_search_path = o.code_search_path;
  opts.python_worker_command = o.python_worker_command;
  opts.warm_workers = o.python_worker_command.empty() ? 0 : WarmWorkers(o.warm_workers);
  if (const char* b = std::getenv("TORUS_BIND_HOST"); b && *b) opts.bind_host = b;
  auto cw = CoreWorker::Create(opts);
  if (!cw.ok()) {
    StopEmbedded();
    throw internal::RayException("ray::Init failed: " + cw.status().ToString());
  }
  g->core = std::move(*cw);
  Publish(g->core.get());
  static std::once_flag once;
  std::call_once(once, [] { std::atexit(ShutdownAtExit); });
}

void ShutdownDriver() {
  std::lock_guard<std::mutex> lock(g_mu);
  Publish(nullptr);
  if (g->core) {
    g->core->Shutdown();
    g->core.reset();
  }
  StopEmbedded();
}

std::string EmbeddedHeadAddress() {
  std::lock_guard<std::mutex> lock(g_mu);
  return g->embedded ? g->embedded->head_address() : "";
}

CoreWorker* Current() { return static_cast<CoreWorker*>(internal::GetRuntime()); }

[[noreturn]] void RunWorker(std::function<std::unique_ptr<Executor>()> make_executor,
                            std::vector<std::string> code_search_path) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  SetLogComponent("worker");
  auto env = [](const char* k) {
    const char* v = std::getenv(k);
    return std::string(v ? v : "");
  };
  CoreWorkerOptions opts;
  opts.is_driver = false;
  opts.worker_id = env("TORUS_WORKER_ID");
  opts.node_address = env("TORUS_NODE_ADDRESS");
  opts.head_address = env("TORUS_HEAD_ADDRESS");
  auto token = CleanToken(env("TORUS_TOKEN"), "TORUS_TOKEN");
  if (!token.ok()) {
    TORUS_LOG(ERROR) << "worker cannot start: " << token.status().message();
    _exit(1);
  }
  opts.token = *token;
  opts.code_search_path = std::move(code_search_path);
  opts.make_executor = std::move(make_executor);
  if (!env("TORUS_BIND_HOST").empty()) opts.bind_host = env("TORUS_BIND_HOST");
  opts.on_ready = [](CoreWorker* w) { Publish(w); };
  auto cw = CoreWorker::Create(opts);
  if (!cw.ok()) {
    TORUS_LOG(ERROR) << "worker cannot start: " << cw.status().ToString();
    _exit(1);
  }
  CoreWorker* w;
  {
    std::lock_guard<std::mutex> lock(g_mu);
    g->core = std::move(*cw);
    w = g->core.get();
    Publish(w);
  }
  w->CaptureOutput();
  w->RunWorkerLoop();
}

}  // namespace core
}  // namespace torus
