// FlatshardClient::WaitForState against a real gRPC server (in this
// process) whose WatchEvents does what a coordinator may: fail UNAVAILABLE
// before its first event (a client that outlived a coordinator restart meets
// the dead connection once), send events and end the stream itself, or
// send nothing until the deadline. What the client makes of each is what
// `flatshard up` and `job wait` decide on.
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "rpc/grpc_server.h"

#include "client/flatshard_client.h"
#include "flatshard/v1/job.grpc.pb.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// WatchEvents as scripted: `failures` attempts fail UNAVAILABLE before any
// event; then `events` are sent, and the stream ends OK, or (`hold`) stays
// open until the client goes away.
class ScriptedJobService final : public v1::JobService::Service {
 public:
  grpc::Status WatchEvents(grpc::ServerContext* context, const v1::WatchEventsRequest* /*request*/,
                           grpc::ServerWriter<v1::JobEvent>* writer) override {
    ++attempts;
    if (failures.fetch_sub(1) > 0) return {grpc::StatusCode::UNAVAILABLE, "Socket closed"};
    for (const v1::JobEvent& event : events) writer->Write(event);
    // Until the client cancels or its deadline passes (or the server
    // stops): what a coordinator does while the job has not changed.
    // Polled: gRPC's sync API offers no wait on a call's cancellation.
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (hold && !context->IsCancelled() && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return grpc::Status::OK;
  }

  std::atomic<int> failures{0};
  std::atomic<int> attempts{0};
  std::vector<v1::JobEvent> events;
  bool hold = false;
};

v1::JobEvent Event(v1::JobState state, const std::string& message = "") {
  v1::JobEvent event;
  event.set_job("j");
  event.set_state(state);
  event.set_message(message);
  return event;
}

class WaitForStateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto server = GrpcServer::Start("127.0.0.1:0", {&service_});
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
    client_ = std::make_unique<FlatshardClient>(server_->address());
  }

  ScriptedJobService service_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<FlatshardClient> client_;
};

TEST_F(WaitForStateTest, ReturnsOnceTheJobHasBeenInAWantedState) {
  service_.events = {Event(v1::PENDING), Event(v1::FORMING), Event(v1::READY)};
  service_.hold = true;
  auto state = client_->WaitForState("j", {v1::READY}, absl::Seconds(30));
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(*state, v1::READY);
}

// The channel's retry policy (rpc/read_retries.h) covers WatchEvents: gRPC
// retries a server stream that failed before its first message.
TEST_F(WaitForStateTest, AWatchThatFailsUnavailableBeforeItsFirstEventIsRetried) {
  service_.failures = 2;
  service_.events = {Event(v1::READY)};
  auto state = client_->WaitForState("j", {v1::READY}, absl::Seconds(30));
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(service_.attempts.load(), 3);
}

// A watch the coordinator ended before the deadline, the state not reached,
// is UNAVAILABLE (the coordinator is stopping, or the job went away), not a
// timeout a caller would wait on again.
TEST_F(WaitForStateTest, AWatchTheServerEndsBeforeTheStateIsUnavailableNotATimeout) {
  service_.events = {Event(v1::PENDING)};
  const absl::Time start = absl::Now();
  auto state = client_->WaitForState("j", {v1::READY}, absl::Seconds(30));
  EXPECT_EQ(state.status().code(), absl::StatusCode::kUnavailable) << state.status();
  EXPECT_THAT(state.status().message(), HasSubstr("the coordinator ended the watch of job 'j'"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(20));  // not waited out
}

TEST_F(WaitForStateTest, AJobThatFailsOnTheWayIsFailedPreconditionWithItsMessage) {
  service_.events = {Event(v1::PENDING), Event(v1::FAILED, "rank 1 wedged")};
  service_.hold = true;
  auto state = client_->WaitForState("j", {v1::READY}, absl::Seconds(30));
  EXPECT_EQ(state.status().code(), absl::StatusCode::kFailedPrecondition) << state.status();
  EXPECT_THAT(state.status().message(), HasSubstr("job 'j' is FAILED: rank 1 wedged"));
}

TEST_F(WaitForStateTest, NoWantedStateBeforeTheDeadlineIsDeadlineExceeded) {
  service_.events = {Event(v1::PENDING)};
  service_.hold = true;
  auto state = client_->WaitForState("j", {v1::READY}, absl::Milliseconds(300));
  EXPECT_EQ(state.status().code(), absl::StatusCode::kDeadlineExceeded) << state.status();
  EXPECT_THAT(state.status().message(), HasSubstr("did not reach the state in 300ms"));
}

}  // namespace
}  // namespace flatshard
