#include "rpc/grpc_server.h"

#include <chrono>

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/health_check_service_interface.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

// Largest message a daemon accepts; bulk data streams in chunks below it.
constexpr int kMaxMessageBytes = 64 << 20;

}  // namespace

absl::StatusOr<std::unique_ptr<GrpcServer>> GrpcServer::Start(
    const std::string& address, const std::vector<grpc::Service*>& services,
    Interceptors interceptors, const std::shared_ptr<grpc::ServerCredentials>& credentials,
    absl::Duration keepalive_interval) {
  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(
      address, credentials != nullptr ? credentials : grpc::InsecureServerCredentials(), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  ApplyServerKeepalive(builder, keepalive_interval);
  for (grpc::Service* service : services) builder.RegisterService(service);
  if (!interceptors.empty()) {
    builder.experimental().SetInterceptorCreators(std::move(interceptors));
  }
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot listen on '", address, "'"));
  }
  const std::string host = address.substr(0, address.rfind(':'));
  return std::unique_ptr<GrpcServer>(
      new GrpcServer(std::move(server), port, absl::StrCat(host, ":", port)));
}

GrpcServer::~GrpcServer() { Shutdown(); }

void GrpcServer::Shutdown() {
  if (server_ == nullptr) return;
  // A graceful shutdown sends every connection a GOAWAY and waits for its
  // peer's part of that exchange, not only for the calls to end. A peer
  // that cannot answer (a stopped or hung process, an unreachable host)
  // holds the wait to this deadline even with no call open; the deadline
  // then cancels what is left and closes its connection. This is where a daemon's stop
  // takes 2 s when one of its peers is frozen (a worker under SIGSTOP
  // keeps its heartbeat channel to the coordinator open).
  server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server_->Wait();
  server_.reset();
}

}  // namespace flatshard
