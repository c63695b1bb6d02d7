// GrpcWorkerClient::Configure, an epoch's first call to a worker, against a
// worker that is not accepting connections yet: it keeps reconnecting for its
// connect grace instead of failing the job at the first refused connection,
// and fails UNAVAILABLE within that grace, not the configure timeout, when
// nothing ever answers. A real gRPC server on a loopback port chosen at run
// time stands in for the worker's service.
#include <future>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "coordinator/grpc_worker_client.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

class ConfiguredWorker final : public v1::WorkerService::Service {
 public:
  grpc::Status Configure(grpc::ServerContext* /*context*/, const v1::ConfigureRequest* request,
                         v1::ConfigureResponse* /*response*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = request->job();
    return grpc::Status::OK;
  }
  std::string job() {
    std::lock_guard<std::mutex> lock(mu_);
    return job_;
  }

 private:
  std::mutex mu_;
  std::string job_;
};

// A loopback port nothing listens on: bound by the kernel's choice, then closed.
int UnusedPort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  EXPECT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  close(fd);
  return ntohs(addr.sin_port);
}

v1::ConfigureRequest Request() {
  v1::ConfigureRequest request;
  request.set_job("late-worker");
  return request;
}

TEST(WorkerClientConnectTest, ConfigureWaitsForAWorkerThatStartsListeningLate) {
  const std::string address = absl::StrCat("127.0.0.1:", UnusedPort());
  GrpcWorkerClient client(address);
  std::future<absl::Status> configured = std::async(std::launch::async, [&] {
    return client.Configure(Request(), absl::Now() + absl::Seconds(30));
  });
  // A channel of the test's own sees the port refuse a connection before the
  // worker starts listening.
  std::shared_ptr<grpc::Channel> probe =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  grpc_connectivity_state state = probe->GetState(/*try_to_connect=*/true);
  while (state != GRPC_CHANNEL_TRANSIENT_FAILURE && absl::Now() < give_up) {
    probe->WaitForStateChange(state, absl::ToChronoTime(give_up));
    state = probe->GetState(/*try_to_connect=*/true);
  }
  ASSERT_EQ(state, GRPC_CHANNEL_TRANSIENT_FAILURE);

  ConfiguredWorker worker;
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials());
  builder.RegisterService(&worker);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  const absl::Status status = configured.get();
  EXPECT_TRUE(status.ok()) << status;
  EXPECT_EQ(worker.job(), "late-worker");
  server->Shutdown();
}

TEST(WorkerClientConnectTest, ConfigureOfAnAddressNothingListensOnFailsWithinTheGrace) {
  const std::string address = absl::StrCat("127.0.0.1:", UnusedPort());
  GrpcWorkerClient client(address);
  const absl::Time start = absl::Now();
  const absl::Status status = client.Configure(Request(), start + absl::Minutes(2));
  EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << status;
  EXPECT_THAT(std::string(status.message()), HasSubstr("cannot connect to " + address));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

}  // namespace
}  // namespace flatshard
