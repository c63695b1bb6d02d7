// Clients that stop reading or vanish, with a real coordinator and real
// workers. One that keeps a summon open but reads nothing (StalledWriteGuard,
// --stalled-write-timeout 7) is cancelled once a write has waited the
// timeout, and the job, whose operation slot the summon held, takes other
// operations again; one that reads slowly but steadily is never cut off. One
// that vanishes with an idle stream (SIGSTOP) is dropped by the coordinator's
// keepalive pings (--keepalive-interval 1), which frees its stream slot.
#include <chrono>
#include <csignal>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "core/job_spec_yaml.h"
#include "core/model_spec_proto.h"
#include "core/model_spec_yaml.h"
#include "flatshard/v1/job.grpc.pb.h"
#include "tests/integration/mlp_cluster.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// Longer than the 5 s a call waits for a busy job's operation slot, so that
// the first Train is refused (naming what holds the job) and a later one
// gets it.
constexpr double kStallSeconds = 7.0;

// ~8.5M parameters (34 MB in float32, streamed in 4 MiB chunks): more than
// the HTTP/2 windows and the loopback socket buffers hold, so a summon whose
// client reads nothing blocks the server's Write.
constexpr char kModel[] = R"(
root:
  type: Sequential
  children:
    - {name: inp, type: Linear, in_features: 64, out_features: 2048}
    - {name: mid, type: Linear, in_features: 2048, out_features: 2048}
    - {name: mid2, type: Linear, in_features: 2048, out_features: 2048}
    - {name: out, type: Linear, in_features: 2048, out_features: 16}
)";

class StalledClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StartCluster({"--stalled-write-timeout", std::to_string(kStallSeconds)});
  }

  void StartCluster(std::vector<std::string> coordinator_flags) {
    auto model = ParseModelSpec(kModel, "stalled.yaml");
    ASSERT_TRUE(model.ok()) << model.status();
    absl::StatusOr<testing::MlpCluster> started = testing::StartMlpCluster(
        "stalled-client", 2, [&](LocalClusterOptions& options, v1::JobSpec& spec) {
          options.coordinator_flags = std::move(coordinator_flags);
          *spec.mutable_model() = ModelSpecToProto(*model);
          spec.clear_wrap_policy();
        });
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(started->cluster);
    client_ = std::move(started->client);
    job_ = started->spec.name();
  }
  void TearDown() override {
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop());
    }
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<FlatshardClient> client_;
  std::string job_;
};

TEST_F(StalledClientTest, SummonThatStopsReadingIsCutOffAndTheJobIsFreeAgain) {
  // The stalled client: a channel of its own with small HTTP/2 windows (no
  // BDP probing, 64 KiB of lookahead), so that what it leaves unread fills
  // them whatever this host's socket buffers hold. It takes the first chunk,
  // then reads nothing more until the test is done with the job.
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, 64 << 10);
  args.SetMaxReceiveMessageSize(64 << 20);
  const std::unique_ptr<v1::JobService::Stub> stub = v1::JobService::NewStub(
      grpc::CreateCustomChannel(cluster_->address(), grpc::InsecureChannelCredentials(), args));
  struct StalledCall {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::TensorChunk>> reader;
    // Reads what is left and ends the call; also on a failed assertion.
    grpc::Status Finish() {
      if (reader == nullptr) return grpc::Status::OK;
      v1::TensorChunk rest;
      while (reader->Read(&rest)) {
      }
      grpc::Status status = reader->Finish();
      reader.reset();
      return status;
    }
    ~StalledCall() {
      if (reader != nullptr) context.TryCancel();
      (void)Finish();
    }
  } stalled;
  v1::SummonFullParamsRequest request;
  request.set_job(job_);
  stalled.reader = stub->SummonFullParams(&stalled.context, request);
  v1::TensorChunk first;
  ASSERT_TRUE(stalled.reader->Read(&first)) << "the summon streamed nothing";
  const absl::Time stalled_at = absl::Now();

  // Meanwhile the summon holds the job's operation slot: a Train waits up
  // to 5 s for it, then is refused naming the summon, until the coordinator
  // cuts the stalled stream off. Bounded at 60 s, far past the timeout;
  // without the guard the summon held the job for as long as the client's
  // connection lived.
  absl::Status trained = absl::UnknownError("not tried");
  int refused = 0;
  const absl::Time give_up = stalled_at + absl::Seconds(60);
  while (absl::Now() < give_up) {
    trained = client_->Train(job_, 1, 0, [](const v1::StepResult&) {});
    if (trained.ok()) break;
    ASSERT_EQ(trained.code(), absl::StatusCode::kFailedPrecondition) << trained;
    EXPECT_THAT(std::string(trained.message()), HasSubstr("is busy (READY, summon parameters for"));
    ++refused;
  }
  ASSERT_TRUE(trained.ok()) << trained << " after " << refused << " refusals";
  EXPECT_GE(refused, 1) << "the summon did not hold the job past the slot's 5 s wait";
  EXPECT_GE(absl::Now() - stalled_at, absl::Seconds(kStallSeconds))
      << "the summon let go of the job before a write had waited the timeout";

  const grpc::Status summoned = stalled.Finish();
  EXPECT_EQ(summoned.error_code(), grpc::StatusCode::CANCELLED) << summoned.error_message();

  // The job is whole: another summon, read at once, streams every parameter.
  int64_t bytes = 0;
  ASSERT_TRUE(client_
                  ->SummonFullParams(job_, false, 0,
                                     [&](const v1::TensorChunk& chunk) {
                                       bytes += static_cast<int64_t>(chunk.data().size());
                                       return absl::OkStatus();
                                     })
                  .ok());
  EXPECT_EQ(bytes, int64_t{4} * (64 * 2048 + 2048 + 2 * (2048 * 2048 + 2048) + 2048 * 16 + 16));
}

TEST_F(StalledClientTest, SlowButSteadyReaderIsNeverCutOff) {
  // Fourteen chunks (up to 4 MiB) at 0.75 s each: the summon takes longer than the stall
  // timeout, but no single write waits that long.
  int64_t bytes = 0;
  const absl::Time start = absl::Now();
  const absl::Status summoned =
      client_->SummonFullParams(job_, false, 0, [&](const v1::TensorChunk& chunk) {
        bytes += static_cast<int64_t>(chunk.data().size());
        std::this_thread::sleep_for(std::chrono::milliseconds(750));  // a slow consumer
        return absl::OkStatus();
      });
  ASSERT_TRUE(summoned.ok()) << summoned;
  EXPECT_GT(absl::Now() - start, absl::Seconds(kStallSeconds));
  EXPECT_EQ(bytes, int64_t{4} * (64 * 2048 + 2048 + 2 * (2048 * 2048 + 2048) + 2048 * 16 + 16));
}

// A client that vanishes without closing its connection (SIGSTOP here; a
// host that lost power or its network alike) while its stream is idle: no
// Write ever blocks, so only the coordinator's keepalive pings, which go
// unanswered, end the stream and free the client's stream slot.
class VanishedClientTest : public StalledClientTest {
 protected:
  void SetUp() override {
    StartCluster({"--keepalive-interval", "1", "--max-streams-per-client", "1"});
  }
};

TEST_F(VanishedClientTest, StoppedWatcherIsDroppedByKeepaliveAndFreesItsStreamSlot) {
  // The setup's wait for READY was a stream too, and its slot is free once
  // the coordinator has seen that call end (within 0.5 s): a watcher refused
  // before then is started again. The job's history is replayed first, so a
  // line means the stream is open.
  std::unique_ptr<ChildProcess> watcher;
  const absl::Time give_up_start = absl::Now() + absl::Seconds(30);
  while (watcher == nullptr && absl::Now() < give_up_start) {
    auto started = ChildProcess::Spawn({std::string(FLATSHARD_BIN_DIR) + "/flatshard", "watch",
                                        "-c", cluster_->address(), "-j", job_});
    ASSERT_TRUE(started.ok()) << started.status();
    if ((*started)->ReadLine(absl::Seconds(60)).ok()) {
      watcher = *std::move(started);
    } else {
      (void)(*started)->Wait(absl::Seconds(10));
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // retry pacing, not sync
    }
  }
  ASSERT_NE(watcher, nullptr) << "no watcher got a stream";
  watcher->Signal(SIGSTOP);
  const absl::Time stopped_at = absl::Now();

  // Every client here is 127.0.0.1, allowed one stream: training (a stream)
  // is refused while the stopped watcher holds the slot, until the pings
  // (every 1 s, 1 s to answer) drop it. Bounded at 60 s; without keepalive
  // the slot stayed taken for as long as the watcher did not exit.
  absl::Status trained = absl::UnknownError("not tried");
  int refused = 0;
  while (absl::Now() < stopped_at + absl::Seconds(60)) {
    trained = client_->Train(job_, 1, 0, [](const v1::StepResult&) {});
    if (trained.ok()) break;
    ASSERT_EQ(trained.code(), absl::StatusCode::kResourceExhausted) << trained;
    ++refused;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));  // retry pacing, not sync
  }
  ASSERT_TRUE(trained.ok()) << trained << " after " << refused << " refusals";
  EXPECT_GE(refused, 1) << "the stopped watcher never held the slot";
  EXPECT_LT(absl::Now() - stopped_at, absl::Seconds(30));

  // Woken, the watcher finds its stream gone and ends with an error.
  watcher->Signal(SIGCONT);
  for (int line = 0; line < 100 && watcher->ReadLine(absl::Seconds(30)).ok(); ++line) {
  }
  const std::optional<int> exit_code = watcher->Wait(absl::Seconds(30));
  ASSERT_TRUE(exit_code.has_value()) << "the watcher did not end";
  EXPECT_NE(*exit_code, 0);
}

}  // namespace
}  // namespace flatshard
