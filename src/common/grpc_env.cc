#include "common/grpc_env.h"

#include <cstdlib>
#include <mutex>

namespace torus {

namespace {
// gRPC's default c-ares resolver did not find names from /etc/hosts (a pod's host entries, a VM
// cluster's hosts file), so a head named there could not be reached.
std::vector<std::string> SetForGrpc() {
  std::vector<std::string> set;
  if (getenv("GRPC_DNS_RESOLVER") == nullptr && setenv("GRPC_DNS_RESOLVER", "native", 0) == 0) {
    set.push_back("GRPC_DNS_RESOLVER");
  }
  return set;
}
const std::vector<std::string> g_set_here = SetForGrpc();
}  // namespace

const std::vector<std::string>& GrpcEnvSetHere() { return g_set_here; }

void ForgetGrpcEnv() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (const auto& k : g_set_here) unsetenv(k.c_str());
  });
}

}  // namespace torus
