// The gRPC server interceptor that counts and times every served call into the process's
// metrics (common/metrics.h: ServedCallMetrics). StartServer installs it on every server.
// THREADS: an interceptor lives on its call's thread; the metrics are thread-safe.
#pragma once

#include <grpcpp/support/server_interceptor.h>

#include <memory>
#include <vector>

namespace torus {

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> CallMetricsInterceptors();

}  // namespace torus
