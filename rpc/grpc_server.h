// Runs gRPC services on an address (port 0 picks a free one and reports it),
// with the standard health service and server reflection, as every flatshard
// daemon does.
#ifndef FLATSHARD_RPC_GRPC_SERVER_H_
#define FLATSHARD_RPC_GRPC_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/support/server_interceptor.h>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rpc/keepalive.h"

namespace flatshard {

class GrpcServer {
 public:
  using Interceptors =
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>>;

  // `address` like "127.0.0.1:0". The services must outlive the server.
  // `interceptors` see every call (the daemons' RPC metrics); `credentials`
  // null serves plaintext (rpc/tls_credentials.h makes TLS ones);
  // `keepalive_interval`: rpc/keepalive.h.
  static absl::StatusOr<std::unique_ptr<GrpcServer>> Start(
      const std::string& address, const std::vector<grpc::Service*>& services,
      Interceptors interceptors = {},
      const std::shared_ptr<grpc::ServerCredentials>& credentials = nullptr,
      absl::Duration keepalive_interval = kServerKeepaliveInterval);
  ~GrpcServer();  // shuts down, cancelling in-flight calls after a short grace

  int port() const { return port_; }
  std::string address() const { return address_; }
  void Shutdown();

 private:
  GrpcServer(std::unique_ptr<grpc::Server> server, int port, std::string address)
      : server_(std::move(server)), port_(port), address_(std::move(address)) {}

  std::unique_ptr<grpc::Server> server_;
  int port_;
  std::string address_;
};

}  // namespace flatshard

#endif  // FLATSHARD_RPC_GRPC_SERVER_H_
