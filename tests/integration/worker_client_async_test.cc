// GrpcWorkerClient's asynchronous calls against a real gRPC server on a
// loopback port chosen at run time: an AwaitSave carries its directory and
// the command token and brings the worker's answer back; CancelAll cancels
// an AwaitSave in flight but not a GetStatusAsync probe (a probe is how a
// failure is seen); the client's destructor waits for the callback of a
// call still in flight before it returns; calls chained from callbacks,
// with the client dropped right after, end cleanly; and a joined summon
// (a rank that streams nothing) brings the worker's answer, is cancelled by
// CancelAll, and fails, cancelled, on a chunk. Disconnect cancels every
// call in flight and refuses every later one.
#include <condition_variable>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include <gmock/gmock.h>
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

// A worker whose AwaitSave, Summon and GetStatus are held until the test
// releases them (AwaitSave and Summon also end when their caller cancels).
class HeldWorker final : public v1::WorkerService::Service {
 public:
  // Streams a chunk first when `stream_a_chunk`; answers `answer` once
  // released.
  grpc::Status Summon(grpc::ServerContext* context, const v1::CommandBatch* batch,
                      grpc::ServerWriter<v1::TensorChunk>* writer) override {
    std::unique_lock<std::mutex> lock(mu_);
    summoned_seq_ = batch->seq();
    NoteTokenLocked(*context);
    if (stream_a_chunk_) {
      v1::TensorChunk chunk;
      chunk.set_fqn("net.0.weight");
      chunk.set_data("abcd");
      writer->Write(chunk);
    }
    if (HeldUntilCancelled(*context, lock)) return grpc::Status::CANCELLED;
    return answer_;
  }
  grpc::Status AwaitSave(grpc::ServerContext* context, const v1::AwaitSaveRequest* request,
                         v1::CommandResult* response) override {
    std::unique_lock<std::mutex> lock(mu_);
    directory_ = request->directory();
    NoteTokenLocked(*context);
    if (HeldUntilCancelled(*context, lock)) return grpc::Status::CANCELLED;
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
  uint64_t summoned_seq() {
    std::lock_guard<std::mutex> lock(mu_);
    return summoned_seq_;
  }
  void StreamAChunk() {
    std::lock_guard<std::mutex> lock(mu_);
    stream_a_chunk_ = true;
  }
  void AnswerSummonWith(grpc::Status answer) {
    std::lock_guard<std::mutex> lock(mu_);
    answer_ = std::move(answer);
  }

 private:
  void NoteTokenLocked(const grpc::ServerContext& context) {
    const auto token = context.client_metadata().find(kCommandTokenKey);
    if (token != context.client_metadata().end()) {
      token_ = std::string(token->second.data(), token->second.size());
    }
  }
  // Counts the call in, holds it until the test releases it or its caller
  // cancels it, and counts it out; true when it was cancelled. Re-checked
  // every 10 ms: a cancelled call has no notification of its own here.
  bool HeldUntilCancelled(const grpc::ServerContext& context, std::unique_lock<std::mutex>& lock) {
    ++entered_;
    changed_.notify_all();
    while (!released_ && !context.IsCancelled()) {
      changed_.wait_for(lock, std::chrono::milliseconds(10));
    }
    ++left_;
    changed_.notify_all();
    return context.IsCancelled();
  }

  std::mutex mu_;
  std::condition_variable changed_;
  int entered_ = 0;
  int left_ = 0;
  bool released_ = false;
  std::string directory_;
  std::string token_;
  uint64_t summoned_seq_ = 0;
  bool stream_a_chunk_ = false;
  grpc::Status answer_;
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

TEST_F(WorkerClientAsyncTest, AJoinedSummonCarriesItsBatchAndBringsTheWorkersAnswer) {
  GrpcWorkerClient client(address_, nullptr, kToken);
  v1::CommandBatch batch;
  batch.set_seq(17);
  worker_.AnswerSummonWith(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, "not unsharded"));
  std::promise<absl::Status> answered;
  client.JoinSummonAsync(&batch, absl::Now() + absl::Seconds(30),
                         [&](absl::Status status) { answered.set_value(std::move(status)); });
  std::future<absl::Status> answer = answered.get_future();
  ASSERT_TRUE(worker_.WaitEntered(1)) << "answered without the worker: " << answer.get();
  worker_.Release();
  const absl::Status status = answer.get();
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(status.message(), "not unsharded");
  EXPECT_EQ(worker_.summoned_seq(), 17u);
  EXPECT_EQ(worker_.token(), kToken);

  // And a worker's plain success is the call's.
  worker_.AnswerSummonWith(grpc::Status::OK);
  std::promise<absl::Status> again;
  client.JoinSummonAsync(&batch, absl::Now() + absl::Seconds(30),
                         [&](absl::Status s) { again.set_value(std::move(s)); });
  const absl::Status ok = again.get_future().get();
  EXPECT_TRUE(ok.ok()) << ok;
}

TEST_F(WorkerClientAsyncTest, AJoinedSummonThatStreamsAChunkIsCancelledAndFailsNamingTheWorker) {
  GrpcWorkerClient client(address_);
  v1::CommandBatch batch;
  worker_.StreamAChunk();  // and then holds the call until it is cancelled
  std::promise<absl::Status> answered;
  client.JoinSummonAsync(&batch, absl::Now() + absl::Seconds(30),
                         [&](absl::Status status) { answered.set_value(std::move(status)); });
  const absl::Status status = answered.get_future().get();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal) << status;
  EXPECT_THAT(std::string(status.message()),
              ::testing::HasSubstr(address_ + " streamed parameters to a summon it only joins"));
  EXPECT_TRUE(worker_.WaitLeft(1));  // the worker saw the cancellation
}

TEST_F(WorkerClientAsyncTest, CancelAllCancelsAJoinedSummon) {
  GrpcWorkerClient client(address_);
  v1::CommandBatch batch;
  std::promise<absl::Status> answered;
  client.JoinSummonAsync(&batch, absl::Now() + absl::Seconds(30),
                         [&](absl::Status status) { answered.set_value(std::move(status)); });
  ASSERT_TRUE(worker_.WaitEntered(1));
  client.CancelAll();
  const absl::Status status = answered.get_future().get();
  EXPECT_EQ(status.code(), absl::StatusCode::kCancelled) << status;
  EXPECT_TRUE(worker_.WaitLeft(1));
}

// A recovery gives a gone worker up (Disconnect): every call in flight is
// cancelled, the probe CancelAll leaves too, and each callback has run when
// Disconnect returns; every call after it fails at once, UNAVAILABLE,
// naming the worker, and reaches no server.
TEST_F(WorkerClientAsyncTest, DisconnectCancelsEveryCallAndRefusesTheNext) {
  GrpcWorkerClient client(address_);
  std::promise<absl::StatusCode> awaited;
  std::promise<absl::StatusCode> probed;
  client.AwaitSave("job/ckpt.partial", absl::Now() + absl::Seconds(30),
                   [&](const absl::StatusOr<v1::CommandResult>& result) {
                     awaited.set_value(result.status().code());
                   });
  client.GetStatusAsync(absl::Now() + absl::Seconds(30),
                        [&](const absl::StatusOr<v1::GetStatusResponse>& status) {
                          probed.set_value(status.status().code());
                        });
  ASSERT_TRUE(worker_.WaitEntered(2));
  client.Disconnect();
  std::future<absl::StatusCode> awaited_code = awaited.get_future();
  std::future<absl::StatusCode> probed_code = probed.get_future();
  ASSERT_EQ(awaited_code.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  ASSERT_EQ(probed_code.wait_for(std::chrono::seconds(0)), std::future_status::ready);
  EXPECT_EQ(awaited_code.get(), absl::StatusCode::kCancelled);
  EXPECT_EQ(probed_code.get(), absl::StatusCode::kCancelled);

  const std::string refusal = address_ + " was disconnected";
  const absl::StatusOr<v1::GetStatusResponse> status =
      client.GetStatus(absl::Now() + absl::Seconds(30));
  EXPECT_EQ(status.status().code(), absl::StatusCode::kUnavailable) << status.status();
  EXPECT_THAT(std::string(status.status().message()), ::testing::HasSubstr(refusal));
  v1::CommandBatch batch;
  const absl::Status summoned =
      client.Summon(batch, absl::Now() + absl::Seconds(30),
                    [](const v1::TensorChunk&) { return absl::OkStatus(); });
  EXPECT_EQ(summoned.code(), absl::StatusCode::kUnavailable) << summoned;
  EXPECT_THAT(std::string(summoned.message()), ::testing::HasSubstr(refusal));
  std::promise<absl::Status> joined;
  client.JoinSummonAsync(&batch, absl::Now() + absl::Seconds(30),
                         [&](absl::Status s) { joined.set_value(std::move(s)); });
  EXPECT_EQ(joined.get_future().get().code(), absl::StatusCode::kUnavailable);
  const absl::Status configured =
      client.Configure(v1::ConfigureRequest(), absl::Now() + absl::Seconds(30));
  EXPECT_EQ(configured.code(), absl::StatusCode::kUnavailable) << configured;
  EXPECT_THAT(std::string(configured.message()), ::testing::HasSubstr(refusal));
  client.Disconnect();  // a second time: nothing left to do
  worker_.Release();
  EXPECT_TRUE(worker_.WaitLeft(1));  // the AwaitSave, cancelled
}

}  // namespace
}  // namespace flatshard
