// GrpcWorkerClient's asynchronous calls against a real gRPC server on a
// loopback port chosen at run time: an AwaitSave carries its directory and
// the command token and brings the worker's answer back; CancelAll cancels
// an AwaitSave in flight but not a GetStatusAsync probe (a probe is how a
// failure is seen); the client's destructor waits for the callback of a
// call still in flight before it returns; and calls chained from callbacks,
// with the client dropped right after, end cleanly.
#include <condition_variable>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <grpcpp/server_context.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/call_metadata.h"

#include "coordinator/grpc_worker_client.h"

namespace flatshard {
namespace {

constexpr char kToken[] = "command-token-1";

// A worker whose AwaitSave and GetStatus are held until the test releases
// them (AwaitSave also ends when its caller cancels it).
class HeldWorker final : public v1::WorkerService::Service {
 public:
  grpc::Status AwaitSave(grpc::ServerContext* context, const v1::AwaitSaveRequest* request,
                         v1::CommandResult* response) override {
    std::unique_lock<std::mutex> lock(mu_);
    directory_ = request->directory();
    const auto token = context->client_metadata().find(kCommandTokenKey);
    if (token != context->client_metadata().end()) {
      token_ = std::string(token->second.data(), token->second.size());
    }
    ++entered_;
    changed_.notify_all();
    // Re-checked every 10 ms: a cancelled call has no notification of its own here.
    while (!released_ && !context->IsCancelled()) {
      changed_.wait_for(lock, std::chrono::milliseconds(10));
    }
    ++left_;
    changed_.notify_all();
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
    response->set_seq(42);
    return grpc::Status::OK;
  }
  grpc::Status GetStatus(grpc::ServerContext*, const v1::GetStatusRequest*,
                         v1::GetStatusResponse* response) override {
    std::unique_lock<std::mutex> lock(mu_);
    ++entered_;
    changed_.notify_all();
    changed_.wait(lock, [this] { return released_; });
    response->set_save_progress(7);
    return grpc::Status::OK;
  }

  // True once `calls` calls are held (within 30 s).
  bool WaitEntered(int calls) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(30), [&] { return entered_ >= calls; });
  }
  // True once `calls` AwaitSave calls have returned (within 30 s).
  bool WaitLeft(int calls) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, std::chrono::seconds(30), [&] { return left_ >= calls; });
  }
  void Release() {
    std::lock_guard<std::mutex> lock(mu_);
    released_ = true;
    changed_.notify_all();
  }
  std::string directory() {
    std::lock_guard<std::mutex> lock(mu_);
    return directory_;
  }
  std::string token() {
    std::lock_guard<std::mutex> lock(mu_);
    return token_;
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  int entered_ = 0;
  int left_ = 0;
  bool released_ = false;
  std::string directory_;
  std::string token_;
};

class WorkerClientAsyncTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    builder.RegisterService(&worker_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_GT(port, 0);
    address_ = absl::StrCat("127.0.0.1:", port);
  }
  void TearDown() override {
    worker_.Release();
    if (server_ != nullptr) server_->Shutdown();
  }

  HeldWorker worker_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;
};

TEST_F(WorkerClientAsyncTest, AwaitSaveCarriesItsRequestAndBringsTheAnswer) {
  GrpcWorkerClient client(address_, nullptr, kToken);
  std::promise<absl::StatusOr<v1::CommandResult>> answered;
  client.AwaitSave(
      "job/ckpt.partial", absl::Now() + absl::Seconds(30),
      [&](absl::StatusOr<v1::CommandResult> result) { answered.set_value(std::move(result)); });
  std::future<absl::StatusOr<v1::CommandResult>> answer = answered.get_future();
  ASSERT_TRUE(worker_.WaitEntered(1)) << "answered without the worker: " << answer.get().status();
  worker_.Release();
  const absl::StatusOr<v1::CommandResult> result = answer.get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->seq(), 42u);
  EXPECT_EQ(worker_.directory(), "job/ckpt.partial");
  EXPECT_EQ(worker_.token(), kToken);
}

TEST_F(WorkerClientAsyncTest, CancelAllCancelsAnAwaitSaveButNotAProbe) {
  GrpcWorkerClient client(address_);
  std::promise<absl::StatusOr<v1::CommandResult>> awaited;
  std::promise<absl::StatusOr<v1::GetStatusResponse>> probed;
  client.AwaitSave(
      "job/ckpt.partial", absl::Now() + absl::Seconds(30),
      [&](absl::StatusOr<v1::CommandResult> result) { awaited.set_value(std::move(result)); });
  client.GetStatusAsync(
      absl::Now() + absl::Seconds(30),
      [&](absl::StatusOr<v1::GetStatusResponse> status) { probed.set_value(std::move(status)); });
  ASSERT_TRUE(worker_.WaitEntered(2));
  client.CancelAll();
  const absl::StatusOr<v1::CommandResult> result = awaited.get_future().get();
  EXPECT_EQ(result.status().code(), absl::StatusCode::kCancelled) << result.status();
  // The probe is still held by the worker, and answers once let go.
  worker_.Release();
  const absl::StatusOr<v1::GetStatusResponse> status = probed.get_future().get();
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->save_progress(), 7u);
}

TEST_F(WorkerClientAsyncTest, TheDestructorWaitsForTheCallbackOfACallInFlight) {
  auto client = std::make_unique<GrpcWorkerClient>(address_);
  std::promise<absl::StatusCode> answered;
  client->AwaitSave("job/ckpt.partial", absl::Now() + absl::Seconds(30),
                    [&](const absl::StatusOr<v1::CommandResult>& result) {
                      answered.set_value(result.status().code());
                    });
  ASSERT_TRUE(worker_.WaitEntered(1));
  std::future<absl::StatusCode> answer = answered.get_future();
  client.reset();  // cancels the call, and returns only after its callback ran
  ASSERT_EQ(answer.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(answer.get(), absl::StatusCode::kCancelled);
  EXPECT_TRUE(worker_.WaitLeft(1));
}

// The async commit's pattern: each call started from the last one's
// callback (which frees the calls answered before it on gRPC's thread,
// while the client holds the channel), and the client dropped as soon as
// the last answer is in. Twenty clients in turn, each a chain of an
// AwaitSave, a probe and another AwaitSave: every answer arrives, and no
// client's teardown aborts the process.
TEST_F(WorkerClientAsyncTest, ChainedCallsThenAClientDroppedAtOnce) {
  worker_.Release();  // every call is answered at once
  for (int round = 0; round < 20; ++round) {
    auto client = std::make_unique<GrpcWorkerClient>(address_);
    std::promise<absl::StatusOr<v1::CommandResult>> last;
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    client->AwaitSave("job/a", deadline, [&](const absl::StatusOr<v1::CommandResult>& first) {
      if (!first.ok()) {
        last.set_value(first.status());
        return;
      }
      client->GetStatusAsync(deadline, [&](const absl::StatusOr<v1::GetStatusResponse>& probe) {
        if (!probe.ok()) {
          last.set_value(probe.status());
          return;
        }
        client->AwaitSave("job/b", deadline, [&](absl::StatusOr<v1::CommandResult> second) {
          last.set_value(std::move(second));
        });
      });
    });
    const absl::StatusOr<v1::CommandResult> result = last.get_future().get();
    client.reset();
    ASSERT_TRUE(result.ok()) << "round " << round << ": " << result.status();
    EXPECT_EQ(result->seq(), 42u);
  }
  EXPECT_EQ(worker_.directory(), "job/b");
}

}  // namespace
}  // namespace flatshard
