// gRPC plumbing shared by every process: the cluster token on every call, channel creation,
// and Status <-> grpc::Status conversion.
//
// Token rule: every server handler starts with `if (auto s = CheckToken(ctx, token_); !s.ok())
// return s;` and every client call is made with a context from NewContext(token).
#pragma once

#include <grpcpp/grpcpp.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/status.h"

namespace torus {

inline constexpr const char* kTokenMetadataKey = "torus-token";

// A client context carrying the token; deadline_ms <= 0 means none.
std::unique_ptr<grpc::ClientContext> NewContext(const std::string& token, int64_t deadline_ms = 0);

// Refuses calls without the right token, with a message that says which.
grpc::Status CheckToken(const grpc::ServerContext* ctx, const std::string& token);

// A channel to host:port with Torus' settings (no message size limit, fast reconnect).
// Channels are cached per address; thread-safe.
std::shared_ptr<grpc::Channel> GetChannel(const std::string& address);

Status FromGrpc(const grpc::Status& s, const std::string& what);
grpc::Status ToGrpc(const Status& s);

// Starts a server on `bind_host:port` (port 0 = pick one); returns the bound port in *port.
std::unique_ptr<grpc::Server> StartServer(const std::string& bind_host, int* port,
                                          const std::vector<grpc::Service*>& services,
                                          int max_threads = 0);

}  // namespace torus
