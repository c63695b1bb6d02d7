// GrpcWorkerClient::Configure, an epoch's first call to a worker, against a
// worker that is not accepting connections yet: it keeps reconnecting for its
// connect grace instead of failing the job at the first refused connection,
// and fails UNAVAILABLE within that grace, not the configure timeout, when
// nothing ever answers; a cancel ends that grace at once. And a client whose
// worker is gone stops dialing its address soon after its last call, and at
// once when it is disconnected. A real gRPC server on a loopback port chosen
// at run time stands in for the worker's service.
#include <algorithm>
#include <future>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

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
#include "coordinator/worker_fan_out.h"
#include "tests/integration/delaying_proxy.h"
#include "tests/integration/port_dials.h"

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
  grpc::Status GetStatus(grpc::ServerContext* /*context*/, const v1::GetStatusRequest* /*request*/,
                         v1::GetStatusResponse* response) override {
    response->set_save_progress(7);
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

// A worker (or a coordinator with thousands of connections to make) can be
// slower to finish a connection's handshake than the channel's reconnect
// backoff (at most 1 s here): the attempt must be given the time, not
// abandoned and redone at every backoff until the call's deadline. Behind a
// proxy that holds the server's SETTINGS back for 2 s, one connection is
// made and the probe answered (with gRPC's minimum connect timeout set to
// the 100 ms backoff, as it was: the first attempt abandoned, and the probe,
// which does not wait for a channel that failed to connect, UNAVAILABLE).
TEST(WorkerClientConnectTest, AHandshakeSlowerThanTheBackoffIsWaitedFor) {
  ConfiguredWorker worker;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&worker);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  testing::DelayingProxy proxy(port, absl::Seconds(2));
  ASSERT_GT(proxy.port(), 0);
  {
    GrpcWorkerClient client(proxy.address());
    const absl::Time asked = absl::Now();
    const absl::StatusOr<v1::GetStatusResponse> status =
        client.GetStatus(asked + absl::Seconds(10));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_EQ(status->save_progress(), 7u);
    EXPECT_GE(absl::Now() - asked, absl::Seconds(2));  // it did wait for the proxy
  }
  EXPECT_EQ(proxy.accepted(), 1);
  server->Shutdown();
}

// The connect grace is a call in flight like any other: CancelAll (a
// formation that another rank failed, a Stop) ends it at once, CANCELLED,
// rather than after the grace as UNAVAILABLE.
TEST(WorkerClientConnectTest, ACancelledConfigureEndsWhileStillConnecting) {
  GrpcWorkerClient client(absl::StrCat("127.0.0.1:", UnusedPort()));
  std::promise<absl::Status> answered;
  const absl::Time start = absl::Now();
  client.ConfigureAsync(Request(), absl::Now() + kConnectGrace, absl::Now() + absl::Minutes(2),
                        [&](absl::Status s) { answered.set_value(std::move(s)); });
  client.CancelAll();
  const absl::Status status = answered.get_future().get();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_LT(absl::Now() - start, kConnectGrace);
}

// A dead worker's port is free for the kernel to hand to the next socket
// bound on that host, as a survivor's new Gloo pair listener (CI, 2026-12-01:
// a worker's port reused 130 ms after it was killed). Gloo's listening pair
// accepts whatever connects first; a coordinator still dialing the dead
// worker's address takes that accept from the peer the pair waits for. The
// client's channel goes idle a second after its last call (up to two, as
// gRPC checks), and idle, it dials no more: here, nothing connects to the
// port from 3 s to 5 s after a failed call (before the idle timeout: a dial
// every 0.7 s, for as long as the client lived).
TEST(WorkerClientConnectTest, AClientOfAGoneWorkerStopsDialingItsAddress) {
  const int port = UnusedPort();
  GrpcWorkerClient client(absl::StrCat("127.0.0.1:", port));
  const absl::Time called = absl::Now();
  EXPECT_EQ(client.GetStatus(called + absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
  const absl::StatusOr<std::vector<std::vector<absl::Duration>>> listened =
      testing::DialsUntil({port}, called, called + absl::Seconds(5));
  ASSERT_TRUE(listened.ok()) << listened.status();
  const std::vector<absl::Duration>& dials = (*listened)[0];
  const auto late_dials = std::count_if(dials.begin(), dials.end(),
                                        [](absl::Duration at) { return at >= absl::Seconds(3); });
  std::cout << dials.size() << " dial(s) in 5 s after the failed call, " << late_dials
            << " after 3 s\n";
  EXPECT_EQ(late_dials, 0);
}

// At scale the idle timeout is long (34 s at 16,384 workers,
// WorkerChannelIdle), so a recovery's probe that finds a worker gone lets
// its channel go at once (Disconnect). Two clients of gone workers with
// that idle timeout, side by side: the one left as it is redials its
// address through the next 3 s; the disconnected one dials no more, and a
// call to it fails at once.
TEST(WorkerClientConnectTest, ADisconnectedClientDialsItsAddressNoMore) {
  const int kept_port = UnusedPort();
  int gone_port = UnusedPort();
  for (int tries = 0; gone_port == kept_port && tries < 10; ++tries) gone_port = UnusedPort();
  ASSERT_NE(gone_port, kept_port);
  const std::string gone_address = absl::StrCat("127.0.0.1:", gone_port);
  const absl::Duration idle = WorkerChannelIdle(16384);
  GrpcWorkerClient kept(absl::StrCat("127.0.0.1:", kept_port), nullptr, "", idle);
  GrpcWorkerClient gone(gone_address, nullptr, "", idle);
  EXPECT_EQ(kept.GetStatus(absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(gone.GetStatus(absl::Now() + absl::Seconds(1)).status().code(),
            absl::StatusCode::kUnavailable);
  gone.Disconnect();
  const absl::Time disconnected = absl::Now();
  const absl::StatusOr<std::vector<std::vector<absl::Duration>>> listened =
      testing::DialsUntil({kept_port, gone_port}, disconnected, disconnected + absl::Seconds(3));
  ASSERT_TRUE(listened.ok()) << listened.status();
  const std::vector<std::vector<absl::Duration>>& dials = *listened;
  std::cout << dials[0].size() << " dial(s) of the kept client's address in 3 s, "
            << dials[1].size() << " of the disconnected one's\n";
  EXPECT_GE(dials[0].size(), 1u);
  EXPECT_EQ(dials[1].size(), 0u);

  const absl::Time asked = absl::Now();
  const absl::StatusOr<v1::GetStatusResponse> status = gone.GetStatus(asked + absl::Seconds(30));
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable) << status.status();
  EXPECT_THAT(std::string(status.status().message()),
              HasSubstr(gone_address + " was disconnected"));
  EXPECT_LT(absl::Now() - asked, absl::Seconds(1));
}

}  // namespace
}  // namespace flatshard
