#include "common/rpc.h"

#include <mutex>
#include <unordered_map>

namespace torus {

namespace {
thread_local bool t_direct_call = false;  // see DirectCallScope
}  // namespace

std::unique_ptr<grpc::ClientContext> NewContext(const std::string& token, int64_t deadline_ms) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  ctx->AddMetadata(kTokenMetadataKey, token);
  if (deadline_ms > 0) {
    ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(deadline_ms));
  }
  return ctx;
}

grpc::Status CheckToken(const grpc::ServerContext* ctx, const std::string& token) {
  if (t_direct_call) return grpc::Status::OK;  // a direct call from this very process
  const auto& md = ctx->client_metadata();
  auto it = md.find(kTokenMetadataKey);
  if (it == md.end()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "missing cluster token: set TORUS_TOKEN or run on the head's machine "
                        "(token file in the session directory)");
  }
  if (std::string_view(it->second.data(), it->second.size()) != token) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong cluster token");
  }
  return grpc::Status::OK;
}

namespace {
std::mutex g_channels_mu;
// Leaked on purpose: used from threads that may outlive static destruction.
auto* g_channels = new std::unordered_map<std::string, std::shared_ptr<grpc::Channel>>();
struct LocalServer {
  grpc::Server* server;
  grpc::Service* service;
};
auto* g_local_servers = new std::unordered_map<std::string, LocalServer>();
}  // namespace

void RegisterInProcessServer(const std::string& address, grpc::Server* server,
                             grpc::Service* service) {
  std::lock_guard<std::mutex> lock(g_channels_mu);
  (*g_local_servers)[address] = {server, service};
  g_channels->erase(address);
}

void UnregisterInProcessServer(const std::string& address) {
  std::lock_guard<std::mutex> lock(g_channels_mu);
  if (g_local_servers->erase(address)) g_channels->erase(address);
}

grpc::Service* InProcessServiceAt(const std::string& address) {
  std::lock_guard<std::mutex> lock(g_channels_mu);
  auto it = g_local_servers->find(address);
  return it == g_local_servers->end() ? nullptr : it->second.service;
}

DirectCallScope::DirectCallScope() : prev_(t_direct_call) { t_direct_call = true; }
DirectCallScope::~DirectCallScope() { t_direct_call = prev_; }

std::shared_ptr<grpc::Channel> GetChannel(const std::string& address) {
  std::lock_guard<std::mutex> lock(g_channels_mu);
  auto* channels = g_channels;
  auto it = channels->find(address);
  if (it != channels->end()) return it->second;
  if (auto ls = g_local_servers->find(address); ls != g_local_servers->end()) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    auto ch = ls->second.server->InProcessChannel(args);
    (*channels)[address] = ch;
    return ch;
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  // gRPC also takes this as the minimum time a connection attempt (TCP + HTTP/2 handshake) may
  // take: at 100 ms, attempts failed with "timed out before receiving SETTINGS frame" whenever the
  // machine was loaded. Retries still start 100 ms after a failure (initial backoff).
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 0);
  auto ch = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  (*channels)[address] = ch;
  return ch;
}

Status FromGrpc(const grpc::Status& s, const std::string& what) {
  if (s.ok()) return Status::Ok();
  StatusCode code = StatusCode::kInternal;
  switch (s.error_code()) {
    case grpc::StatusCode::UNAVAILABLE: code = StatusCode::kUnavailable; break;
    case grpc::StatusCode::UNAUTHENTICATED: code = StatusCode::kUnauthenticated; break;
    case grpc::StatusCode::DEADLINE_EXCEEDED: code = StatusCode::kDeadlineExceeded; break;
    case grpc::StatusCode::INVALID_ARGUMENT: code = StatusCode::kInvalidArgument; break;
    case grpc::StatusCode::NOT_FOUND: code = StatusCode::kNotFound; break;
    case grpc::StatusCode::ALREADY_EXISTS: code = StatusCode::kAlreadyExists; break;
    case grpc::StatusCode::FAILED_PRECONDITION: code = StatusCode::kFailedPrecondition; break;
    case grpc::StatusCode::CANCELLED: code = StatusCode::kCancelled; break;
    default: break;
  }
  return Status(code, what + ": " + s.error_message());
}

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (s.code()) {
    case StatusCode::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case StatusCode::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case StatusCode::kAlreadyExists: code = grpc::StatusCode::ALREADY_EXISTS; break;
    case StatusCode::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case StatusCode::kDeadlineExceeded: code = grpc::StatusCode::DEADLINE_EXCEEDED; break;
    case StatusCode::kFailedPrecondition: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case StatusCode::kUnauthenticated: code = grpc::StatusCode::UNAUTHENTICATED; break;
    default: break;
  }
  return grpc::Status(code, s.message());
}

std::unique_ptr<grpc::Server> StartServer(const std::string& bind_host, int* port,
                                          const std::vector<grpc::Service*>& services,
                                          int max_threads) {
  grpc::ServerBuilder builder;
  builder.AddListeningPort(bind_host + ":" + std::to_string(*port),
                           grpc::InsecureServerCredentials(), port);
  builder.SetMaxReceiveMessageSize(-1);
  builder.SetMaxSendMessageSize(-1);
  if (max_threads > 0) {
    grpc::ResourceQuota quota;
    quota.SetMaxThreads(max_threads);
    builder.SetResourceQuota(quota);
  }
  for (auto* s : services) builder.RegisterService(s);
  return builder.BuildAndStart();
}

}  // namespace torus
