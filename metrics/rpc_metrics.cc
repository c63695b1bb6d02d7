#include "metrics/rpc_metrics.h"

#include <chrono>
#include <string>

#include "absl/status/status.h"
#include "metrics/duration_buckets.h"
#include "prometheus/histogram.h"

namespace flatshard {
namespace {

using grpc::experimental::InterceptionHookPoints;

class RpcTimer final : public grpc::experimental::Interceptor {
 public:
  RpcTimer(prometheus::Family<prometheus::Histogram>* family, const char* method)
      : family_(family), method_(method == nullptr ? "unknown" : method) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      const grpc::Status status = methods->GetSendStatus();
      const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start_;
      // grpc::StatusCode and absl::StatusCode share their numbering.
      const std::string code =
          absl::StatusCodeToString(static_cast<absl::StatusCode>(status.error_code()));
      family_->Add({{"method", method_}, {"code", code}}, DurationBuckets())
          .Observe(elapsed.count());
    }
    methods->Proceed();
  }

 private:
  prometheus::Family<prometheus::Histogram>* family_;
  std::string method_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
};

class RpcTimerFactory final : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit RpcTimerFactory(prometheus::Registry& registry)
      : family_(&prometheus::BuildHistogram()
                     .Name("flatshard_rpc_duration_seconds")
                     .Help("Time to serve a gRPC call, until its status is sent (streams "
                           "included), by method and status code")
                     .Register(registry)) {}

  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new RpcTimer(family_, info->method());
  }

 private:
  prometheus::Family<prometheus::Histogram>* family_;
};

}  // namespace

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcMetricsInterceptor(
    prometheus::Registry& registry) {
  return std::make_unique<RpcTimerFactory>(registry);
}

}  // namespace flatshard
