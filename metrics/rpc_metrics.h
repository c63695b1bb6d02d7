// flatshard_rpc_duration_seconds{method,code}: how long each gRPC call a
// daemon serves takes, end to end (streams: until their status is sent), by
// full method name and status code. A server interceptor, so every service
// on the server is covered without touching its handlers.
#ifndef FLATSHARD_METRICS_RPC_METRICS_H_
#define FLATSHARD_METRICS_RPC_METRICS_H_

#include <memory>

#include <grpcpp/support/server_interceptor.h>

#include "prometheus/registry.h"

namespace flatshard {

// The factory keeps references into `registry`, which must outlive the server.
std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> RpcMetricsInterceptor(
    prometheus::Registry& registry);

}  // namespace flatshard

#endif  // FLATSHARD_METRICS_RPC_METRICS_H_
