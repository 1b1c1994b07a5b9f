// gRPC plumbing shared by every process: the cluster token on every call, channel creation,
// Status <-> grpc::Status conversion, and a Status as the wire's Error.
//
// Token rule: every server handler starts with `if (auto s = CheckToken(ctx, token_); !s.ok())
// return s;` and every client call is made with a context from NewContext(token).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace torus {
namespace rpc {
class Error;
}  // namespace rpc

inline constexpr const char* kTokenMetadataKey = "torus-token";

// A client context carrying the token; deadline_ms <= 0 means none. A token that is not printable
// ASCII (never one read through CleanToken) is left out rather than handed to gRPC, which aborts.
std::unique_ptr<grpc::ClientContext> NewContext(const std::string& token, int64_t deadline_ms = 0);

// Refuses calls without the right token, with a message that says which. The comparison takes
// the same time wherever the first difference is (TokenEquals). A server whose own token is
// empty refuses every call (it must never have started: FindToken refuses such tokens).
grpc::Status CheckToken(const grpc::ServerContext* ctx, const std::string& token);

// `given == expected` in a time that depends only on their lengths, not on where they differ:
// every token comparison (gRPC metadata, lane hello) goes through it. Thread-safe.
bool TokenEquals(std::string_view given, std::string_view expected);

// A channel to host:port with Torus' settings (no message size limit, fast reconnect).
// Channels are cached per address; thread-safe. When the server at `address` runs in this
// very process (the embedded default cluster: driver, head and node in one process; or
// `torus start --head --block`), the channel is the server's in-process channel: the same
// calls, token and messages, without the loopback TCP and HTTP/2 framing.
std::shared_ptr<grpc::Channel> GetChannel(const std::string& address);
// For a one-off call to an address this process may never call again (`torus timeline` asking
// every worker): the cached or in-process channel when there is one, else a new channel that is
// not cached (closed when the caller drops it). Thread-safe.
std::shared_ptr<grpc::Channel> GetOneOffChannel(const std::string& address);

// The host part of "host:port" (the whole string when it has no port).
std::string HostOf(const std::string& address);

// Servers of this process, by the address clients use. StartServer's callers register after
// the server is up and unregister before shutting it down (the service must outlive that).
void RegisterInProcessServer(const std::string& address, grpc::Server* server,
                             grpc::Service* service);
void UnregisterInProcessServer(const std::string& address);
grpc::Service* InProcessServiceAt(const std::string& address);

// While alive on a thread, CheckToken accepts calls on it: set around a direct in-process call
// (the caller is this process, which holds the token already).
class DirectCallScope {
 public:
  DirectCallScope();
  ~DirectCallScope();
  DirectCallScope(const DirectCallScope&) = delete;
  DirectCallScope& operator=(const DirectCallScope&) = delete;

 private:
  bool prev_;
};

// A unary call to the service at `address`: when that service lives in this process, its
// handler runs directly on the calling thread (no serialisation, no thread hop); otherwise a
// normal gRPC call with the token and deadline. Control-plane paths that are hot in the
// embedded cluster (placement groups) use it.
template <class Service, class Stub, class Req, class Rep>
grpc::Status Unary(const std::string& address, const std::string& token, int64_t deadline_ms,
                   grpc::Status (Service::*local)(grpc::ServerContext*, const Req*, Rep*),
                   grpc::Status (Stub::*remote)(grpc::ClientContext*, const Req&, Rep*),
                   const Req& req, Rep* rep) {
  if (auto* svc = dynamic_cast<Service*>(InProcessServiceAt(address))) {
    DirectCallScope scope;
    grpc::ServerContext sctx;
    return (svc->*local)(&sctx, &req, rep);
  }
  auto ctx = NewContext(token, deadline_ms);
  Stub stub(GetChannel(address));
  return (stub.*remote)(ctx.get(), req, rep);
}

Status FromGrpc(const grpc::Status& s, const std::string& what);
grpc::Status ToGrpc(const Status& s);

// Fills a wire Error. The text is made valid UTF-8 (each byte outside a well-formed sequence
// becomes '?'): it may come from user code (an exception's what()), and a proto string field
// that is not UTF-8 makes the whole message fail to parse at the receiver.
void SetError(rpc::Error* e, StatusCode code, const std::string& msg);
inline void SetError(rpc::Error* e, const Status& s) { SetError(e, s.code(), s.message()); }
std::string ValidUtf8(const std::string& s);

// Starts a server on `bind_host:port` (port 0 = pick one); returns the bound port in *port.
// The port is never shared: SO_REUSEPORT is off (gRPC turns it on by default, which let a second
// server bind a port in use and take half of its connections). On failure returns null and,
// when `why` is given, sets it to the reason, e.g. "address already in use".
std::unique_ptr<grpc::Server> StartServer(const std::string& bind_host, int* port,
                                          const std::vector<grpc::Service*>& services,
                                          int max_threads = 0, std::string* why = nullptr);

// Why a TCP socket cannot listen on host:port now (strerror of bind/listen in lower case, e.g.
// "address already in use"), or "" if it can. Binds without SO_REUSEPORT and closes at once.
std::string WhyCannotListen(const std::string& host, int port);

}  // namespace torus
