// An abort that reaches a worker while its Configure builds the epoch's
// runtime: the coordinator's Abort of that epoch, the Configure of a newer
// one, or the daemon's own shutdown (SIGTERM). The Configure lets go of its
// rendezvous at once, rather than at the collective timeout, whether it waits
// in the store or in Gloo for a peer to connect, and installs nothing: the
// worker reports the epoch aborted, not ready, and a daemon told to stop
// exits promptly. And a Configure whose rank could not connect to a peer
// says which, over the call, for the coordinator to blame.
// Real daemons (LocalCluster), driven here as the coordinator drives them.
#include <csignal>
#include <iostream>
#include <optional>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "coordinator/grpc_worker_client.h"
#include "core/status_payloads.h"
#include "tests/integration/mlp_cluster.h"
#include "tests/integration/recovery_harness.h"
#include "tests/integration/rendezvous_test_util.h"
#include "worker/comm/grpc_store.h"

namespace flatshard {
namespace {

using ::testing::AnyOf;
using ::testing::HasSubstr;

// Long enough that a rendezvous left to its timeout fails every bound below.
constexpr double kCollectiveTimeoutS = 300;
constexpr uint64_t kEpoch = 7;
// A Configure's deadline: shorter than a rendezvous left to its timeout.
constexpr absl::Duration kDeadline = absl::Seconds(60);

class ConfigureAbortTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::MlpCluster> started =
        testing::StartMlpCluster("configure-abort", 2, [](LocalClusterOptions& options, auto&) {
          options.collective_timeout_s = kCollectiveTimeoutS;
        });
    ASSERT_TRUE(started.ok()) << started.status();
    cluster_ = std::move(started->cluster);
    client_ = std::move(started->client);
    spec_ = started->spec;
    // The job's units, as the coordinator cut them; then the job goes, so the
    // coordinator leaves the workers to this test.
    absl::StatusOr<v1::Job> job = client_->GetJob(spec_.name());
    ASSERT_TRUE(job.ok()) << job.status();
    job_ = *job;
    ASSERT_TRUE(client_->DeleteJob(spec_.name()).ok());
    rank0_ = std::make_unique<GrpcWorkerClient>(cluster_->worker_addresses()[0], nullptr,
                                                cluster_->command_token());
    rank1_ = std::make_unique<GrpcWorkerClient>(cluster_->worker_addresses()[1], nullptr,
                                                cluster_->command_token());
  }
  void TearDown() override {
    if (configuring_.joinable()) {
      // A test that failed early leaves the Configure waiting: end it now.
      rank0_->Abort(0, "the test ends", absl::Now() + absl::Seconds(10)).IgnoreError();
      configuring_.join();
    }
    if (cluster_ != nullptr) {
      EXPECT_TRUE(cluster_->Stop());
    }
  }

  // Rank `rank` of the job's 2 ranks in `epoch`, rendezvousing under `prefix`.
  v1::ConfigureRequest Request(uint64_t epoch, int rank, const std::string& prefix) const {
    v1::ConfigureRequest request;
    request.set_job(spec_.name());
    request.set_job_epoch(epoch);
    request.set_rank(rank);
    request.set_world_size(2);
    *request.mutable_spec() = job_.spec();
    *request.mutable_units() = job_.units();
    request.set_store_prefix(prefix);
    return request;
  }

  // Starts rank 0 alone into epoch kEpoch: its rendezvous waits for a rank 1
  // nobody configures. Returns once the worker says it is configuring.
  void StartConfiguringRank0Alone(const std::string& prefix = "test/configure-abort") {
    const v1::ConfigureRequest request = Request(kEpoch, 0, prefix);
    configuring_ = std::thread([this, request] {
      configured_ = rank0_->Configure(request, absl::Now() + absl::Seconds(120));
      returned_ = absl::Now();
    });
    const absl::Time started = absl::Now();
    absl::StatusOr<v1::GetStatusResponse> status;
    do {
      status = rank0_->GetStatus(absl::Now() + absl::Seconds(5));
    } while (!(status.ok() && status->state() == "configuring" && status->job_epoch() == kEpoch) &&
             absl::Now() - started < absl::Seconds(30));
    ASSERT_TRUE(status.ok()) << status.status();
    ASSERT_EQ(status->state(), "configuring");
    ASSERT_EQ(status->job_epoch(), kEpoch);
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<FlatshardClient> client_;
  v1::JobSpec spec_;
  v1::Job job_;
  std::unique_ptr<GrpcWorkerClient> rank0_;
  std::unique_ptr<GrpcWorkerClient> rank1_;
  std::thread configuring_;
  absl::Status configured_;  // written by configuring_, read after its join
  absl::Time returned_;
};

TEST_F(ConfigureAbortTest, AnAbortDuringTheRendezvousEndsTheConfigureAtOnceAndInstallsNothing) {
  ASSERT_NO_FATAL_FAILURE(StartConfiguringRank0Alone());
  const absl::Time aborted = absl::Now();
  ASSERT_TRUE(rank0_
                  ->Abort(kEpoch, "the job failed: rank 1 missed heartbeats",
                          absl::Now() + absl::Seconds(10))
                  .ok());
  configuring_.join();
  EXPECT_EQ(configured_.code(), absl::StatusCode::kAborted) << configured_;
  EXPECT_THAT(configured_.message(),
              HasSubstr(absl::StrCat("configure for epoch ", kEpoch,
                                     " was aborted while it built (the job failed: rank 1 "
                                     "missed heartbeats)")));
  EXPECT_LT(returned_ - aborted, absl::Seconds(30))
      << "the rendezvous ran on toward its " << kCollectiveTimeoutS << " s timeout";
  std::cout << "configure released " << absl::FormatDuration(returned_ - aborted)
            << " after the abort\n";
  absl::StatusOr<v1::GetStatusResponse> status = rank0_->GetStatus(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), "aborted");
  EXPECT_EQ(status->job_epoch(), kEpoch);

  // The worker is free for the next formation: the job forms on both and trains.
  testing::CreateAndWaitReady(*client_, spec_);
  EXPECT_TRUE(client_->Train(spec_.name(), 1, 0, [](const v1::StepResult&) {}).ok());
}

// The coordinator's retry after a formation failed on a rank that had
// published its Gloo addresses and then never connected (its configure
// failed, or it was killed): rank 0 waits in Gloo for that rank to connect,
// where no store abort reaches, five collective timeouts long, and its next
// Configure would wait behind it. The retry's Configure, of the next epoch,
// ends that wait, and both ranks form at once.
TEST_F(ConfigureAbortTest, ANewEpochEndsARendezvousWaitingForAPeerThatNeverConnects) {
  // Rank 1's record as it left it, set through a registered session as a
  // worker sets it.
  absl::StatusOr<std::unique_ptr<GrpcStore>> spare =
      testing::StoreAsSpare(cluster_->address(), "absent-rank-1");
  ASSERT_TRUE(spare.ok()) << spare.status();
  GrpcStore& store = **spare;
  ASSERT_TRUE(store.Set("test/stuck/gloo/1", testing::AbsentPeerAddresses(2)).ok());
  ASSERT_NO_FATAL_FAILURE(StartConfiguringRank0Alone("test/stuck"));
  // Rank 0 published its own; a second later it is past the store call that
  // follows (which a store abort would end), waiting in Gloo for rank 1 to
  // connect: still configuring.
  ASSERT_TRUE(store.Wait({"test/stuck/gloo/0"}, absl::Seconds(30)).ok());
  absl::SleepFor(absl::Seconds(1));
  absl::StatusOr<v1::GetStatusResponse> status = rank0_->GetStatus(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), "configuring");

  const absl::Time retry = absl::Now();
  absl::Status rank1_configured;
  std::thread rank1([&] {
    rank1_configured = rank1_->Configure(Request(kEpoch + 1, 1, "test/retry"), retry + kDeadline);
  });
  const absl::Status rank0_configured =
      rank0_->Configure(Request(kEpoch + 1, 0, "test/retry"), retry + kDeadline);
  rank1.join();
  const absl::Duration took = absl::Now() - retry;
  EXPECT_TRUE(rank0_configured.ok()) << rank0_configured;
  EXPECT_TRUE(rank1_configured.ok()) << rank1_configured;
  EXPECT_LT(took, absl::Seconds(30)) << "the old rendezvous ran on toward its timeout";
  std::cout << "the next epoch formed " << absl::FormatDuration(took) << " after its Configure\n";
  configuring_.join();
  EXPECT_EQ(configured_.code(), absl::StatusCode::kAborted) << configured_;
  EXPECT_THAT(configured_.message(),
              HasSubstr(absl::StrCat("re-configured for epoch ", kEpoch + 1)));
}

// A rank whose connection to a peer is refused fails its Configure at once,
// UNAVAILABLE, and names that peer in a payload that crosses the call: the
// coordinator then blames the link (coordinator/link_failures.h), where the
// failed Configure alone would blame the rank that reported it.
TEST_F(ConfigureAbortTest, ARankThatCannotReachAPeerSaysWhichOverTheCall) {
  absl::StatusOr<std::unique_ptr<GrpcStore>> spare =
      testing::StoreAsSpare(cluster_->address(), "refusing-rank-1");
  ASSERT_TRUE(spare.ok()) << spare.status();
  GrpcStore& store = **spare;
  ASSERT_TRUE(store.Set("test/refused/gloo/1", testing::RefusingPeerAddresses(2)).ok());
  const absl::Time begin = absl::Now();
  const absl::Status configured =
      rank0_->Configure(Request(kEpoch, 0, "test/refused"), begin + kDeadline);
  EXPECT_EQ(configured.code(), absl::StatusCode::kUnavailable) << configured;
  EXPECT_EQ(UnreachablePeer(configured), std::optional<int>(1)) << configured;
  EXPECT_THAT(configured.message(), HasSubstr("its pair to world rank 1 did not connect"));
  EXPECT_LT(absl::Now() - begin, absl::Seconds(30)) << "a refused connection is not a timeout";
  absl::StatusOr<v1::GetStatusResponse> status = rank0_->GetStatus(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), "failed");
}

TEST_F(ConfigureAbortTest, AnAbortOfAnOlderEpochLeavesTheConfigureAlone) {
  ASSERT_NO_FATAL_FAILURE(StartConfiguringRank0Alone());
  // Decided against the epoch before (a straggling verdict): refused.
  const absl::Status stale =
      rank0_->Abort(kEpoch - 1, "the job failed in epoch 6", absl::Now() + absl::Seconds(10));
  EXPECT_EQ(stale.code(), absl::StatusCode::kFailedPrecondition) << stale;
  EXPECT_THAT(stale.message(), HasSubstr("abort.job_epoch 6 is older than this worker's epoch 7"));
  absl::StatusOr<v1::GetStatusResponse> status = rank0_->GetStatus(absl::Now() + absl::Seconds(5));
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), "configuring");
  // Then the coordinator gives up on this epoch too.
  ASSERT_TRUE(rank0_->Abort(0, "formation abandoned", absl::Now() + absl::Seconds(10)).ok());
  configuring_.join();
  EXPECT_EQ(configured_.code(), absl::StatusCode::kAborted) << configured_;
}

TEST_F(ConfigureAbortTest, ADaemonStoppedDuringItsRendezvousExitsAtOnce) {
  ASSERT_NO_FATAL_FAILURE(StartConfiguringRank0Alone());
  const absl::Time stopping = absl::Now();
  cluster_->worker(0).Signal(SIGTERM);
  // The server's stop waits for the Configure it serves.
  const std::optional<int> exited = cluster_->worker(0).Wait(absl::Seconds(60));
  ASSERT_TRUE(exited.has_value()) << "the daemon waited for its rendezvous";
  EXPECT_TRUE(WIFEXITED(*exited) && WEXITSTATUS(*exited) == 0) << *exited;
  EXPECT_LT(absl::Now() - stopping, absl::Seconds(30));
  std::cout << "daemon exited " << absl::FormatDuration(absl::Now() - stopping)
            << " after its SIGTERM\n";
  configuring_.join();
  // Aborted as it stopped, or cut off by the server's stop: never configured.
  EXPECT_THAT(configured_.code(), AnyOf(absl::StatusCode::kAborted, absl::StatusCode::kUnavailable,
                                        absl::StatusCode::kCancelled))
      << configured_;
}

}  // namespace
}  // namespace flatshard
