#include "common/rpc_metrics.h"

#include <chrono>

#include "common/metrics.h"

namespace torus {

namespace {

using grpc::experimental::InterceptionHookPoints;

class CallTimer final : public grpc::experimental::Interceptor {
 public:
  explicit CallTimer(grpc::experimental::ServerRpcInfo* info)
      : metrics_(ServedCallMetrics(info->method() ? info->method() : "(unknown)")),
        t0_(std::chrono::steady_clock::now()) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* m) override {
    if (m->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      metrics_->Record(m->GetSendStatus().ok(),
                       std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count());
    }
    m->Proceed();
  }

 private:
  const CallMetrics* metrics_;
  std::chrono::steady_clock::time_point t0_;
};

class CallTimerFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  grpc::experimental::Interceptor* CreateServerInterceptor(grpc::experimental::ServerRpcInfo* info) override {
    return new CallTimer(info);
  }
};

}  // namespace

std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> CallMetricsInterceptors() {
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> v;
  v.push_back(std::make_unique<CallTimerFactory>());
  return v;
}

}  // namespace torus
