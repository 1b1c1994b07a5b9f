#include "common/rpc.h"

#include <execinfo.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "common/grpc_env.h"
#include "common/logging.h"
#include "common/rpc_metrics.h"
#include "common/thread_annotations.h"
#include "proto/torus.pb.h"

namespace torus {

namespace {
thread_local bool t_direct_call = false;  // see DirectCallScope
}  // namespace

std::unique_ptr<grpc::ClientContext> NewContext(const std::string& token, int64_t deadline_ms) {
  auto ctx = std::make_unique<grpc::ClientContext>();
  // gRPC aborts the process (printing the value) on a metadata value outside printable ASCII.
  // Every token read passes CleanToken (common/session.h), so this only guards against our own
  // bugs: such a token is not sent, and the server answers "missing cluster token".
  bool legal = std::all_of(token.begin(), token.end(), [](char c) { return c >= 0x20 && c < 0x7f; });
  if (legal) ctx->AddMetadata(kTokenMetadataKey, token);
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
  if (token.empty()) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                        "this server has no cluster token and refuses every call");
  }
  if (!TokenEquals(std::string_view(it->second.data(), it->second.size()), token)) {
    return grpc::Status(grpc::StatusCode::UNAUTHENTICATED, "wrong cluster token");
  }
  return grpc::Status::OK;
}

bool TokenEquals(std::string_view given, std::string_view expected) {
  // Every byte of `expected` is looked at, whatever `given` holds; the only early answer is for
  // an empty `expected` (never a valid token).
  if (expected.empty()) return false;
  volatile unsigned char diff = given.size() == expected.size() ? 0 : 1;
  for (size_t i = 0; i < expected.size(); ++i) {
    unsigned char g = i < given.size() ? static_cast<unsigned char>(given[i]) : 0;
    diff = diff | (g ^ static_cast<unsigned char>(expected[i]));
  }
  return diff == 0;
}

namespace {
Mutex g_channels_mu;
// Leaked on purpose: used from threads that may outlive static destruction.
auto* g_channels PT_GUARDED_BY(g_channels_mu) =
    new std::unordered_map<std::string, std::shared_ptr<grpc::Channel>>();
struct LocalServer {
  grpc::Server* server;
  grpc::Service* service;
};
auto* g_local_servers PT_GUARDED_BY(g_channels_mu) =
    new std::unordered_map<std::string, LocalServer>();
}  // namespace

void RegisterInProcessServer(const std::string& address, grpc::Server* server,
                             grpc::Service* service) {
  MutexLock lock(g_channels_mu);
  (*g_local_servers)[address] = {server, service};
  g_channels->erase(address);
}

void UnregisterInProcessServer(const std::string& address) {
  MutexLock lock(g_channels_mu);
  if (g_local_servers->erase(address)) g_channels->erase(address);
}

grpc::Service* InProcessServiceAt(const std::string& address) {
  MutexLock lock(g_channels_mu);
  auto it = g_local_servers->find(address);
  return it == g_local_servers->end() ? nullptr : it->second.service;
}

DirectCallScope::DirectCallScope() : prev_(t_direct_call) { t_direct_call = true; }
DirectCallScope::~DirectCallScope() { t_direct_call = prev_; }

namespace {
std::shared_ptr<grpc::Channel> NewTcpChannel(const std::string& address) {
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
  // A name is looked up again at most once a second (gRPC's default: 30 s), so a head that
  // came back at a new address behind the same name (a recreated pod) is found at once.
  args.SetInt(GRPC_ARG_DNS_MIN_TIME_BETWEEN_RESOLUTIONS_MS, 1000);
  auto channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
  ForgetGrpcEnv();  // gRPC chose its resolver when it made the channel (common/grpc_env.h)
  return channel;
}
}  // namespace

std::shared_ptr<grpc::Channel> GetChannel(const std::string& address) {
  if (address.empty()) {
    // Never meant: a caller lost an address on its way. Say who, once per process (gRPC only
    // says "no server name supplied in dns URI", and every call on the channel fails).
    static std::atomic<bool> said{false};
    if (!said.exchange(true)) {
      TORUS_LOG(ERROR) << "a gRPC channel to an empty address was asked for; the calls on it "
                          "will fail. Caller's stack:";
      void* frames[32];
      int n = backtrace(frames, 32);
      backtrace_symbols_fd(frames, n, STDERR_FILENO);
    }
  }
  MutexLock lock(g_channels_mu);
  auto* channels = g_channels;
  auto it = channels->find(address);
  if (it != channels->end()) return it->second;
#ifndef TORUS_TSAN_BUILD
  if (auto ls = g_local_servers->find(address); ls != g_local_servers->end()) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(-1);
    args.SetMaxSendMessageSize(-1);
    auto ch = ls->second.server->InProcessChannel(args);
    (*channels)[address] = ch;
    return ch;
  }
#else
  // Under ThreadSanitizer the server is reached over loopback TCP instead: gRPC's in-process
  // transport hands the slice a message was serialised into from the writing thread to the
  // reading one under gRPC's own locks, which TSan cannot see (gRPC is not instrumented), so it
  // reported the serialiser's writes and the parser's reads of that buffer as races.
#endif
  auto ch = NewTcpChannel(address);
  (*channels)[address] = ch;
  return ch;
}

std::string HostOf(const std::string& address) {
  auto colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

std::shared_ptr<grpc::Channel> GetOneOffChannel(const std::string& address) {
  {
    MutexLock lock(g_channels_mu);
    if (auto it = g_channels->find(address); it != g_channels->end()) return it->second;
  }
  if (InProcessServiceAt(address) != nullptr) return GetChannel(address);
  return NewTcpChannel(address);
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
                                          int max_threads, std::string* why) {
  const int wanted = *port;
  grpc::ServerBuilder builder;
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
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
  builder.experimental().SetInterceptorCreators(CallMetricsInterceptors());
  auto server = builder.BuildAndStart();
  if ((!server || *port == 0) && why) {
    *why = wanted == 0 ? std::string() : WhyCannotListen(bind_host, wanted);
    if (why->empty()) *why = "gRPC could not listen there";
  }
  return server;
}

std::string WhyCannotListen(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  std::string h = host;
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  addrinfo* res = nullptr;
  int rc = getaddrinfo(h.empty() ? nullptr : h.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0 || !res) return std::string("cannot resolve ") + host + ": " + gai_strerror(rc);
  std::string why;
  int fd = socket(res->ai_family, res->ai_socktype | SOCK_CLOEXEC, res->ai_protocol);
  if (fd < 0) {
    why = strerror(errno);
  } else {
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as gRPC: TIME_WAIT is no obstacle
    if (bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 1) != 0) why = strerror(errno);
    close(fd);
  }
  freeaddrinfo(res);
  for (char& c : why) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  return why;
}

std::string ValidUtf8(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    bool ok = n > 0 && i + n <= s.size() && !(n == 2 && c < 0xC2);
    for (size_t k = 1; ok && k < n; ++k) ok = (static_cast<unsigned char>(s[i + k]) >> 6) == 0x2;
    if (ok) {
      out.append(s, i, n);
      i += n;
    } else {
      out.push_back('?');
      i += 1;
    }
  }
  return out;
}

void SetError(rpc::Error* e, StatusCode code, const std::string& msg) {
  e->set_code(static_cast<int>(code));
  e->set_message(ValidUtf8(msg));
}

}  // namespace torus
