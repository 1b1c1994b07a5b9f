// Hand-made RPCs for the tests that talk to the daemons' ports directly (security, hardening):
// a channel to an address, and the wire's resource units. Header-only; thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <memory>
#include <string>

namespace torus_test {

constexpr int64_t kUnits = 10000;  // ResourceSet.units per whole resource (docs/wire.md)

// An insecure channel to `address` that takes answers of any size.
inline std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

}  // namespace torus_test
