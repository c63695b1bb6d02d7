// A load that one rank refuses to apply after every rank reported its stage
// (docs/checkpoints.md, "Loading"): rank 0 applies the checkpoint, rank 1
// has nothing staged and says so, and the ranks now disagree. The job must
// not stay READY on that: the coordinator recovers it as from any failed
// batch, back to its recovery checkpoint, and reports the rank's refusal.
//
// A coordinator in this process drives two real worker daemons. Rank 1's
// client misreports one stage: it sends the stage with a directory that does
// not exist (stamped with that content's digest, so the worker takes it),
// and answers the coordinator as if it had staged. The worker's refusal of
// the apply that follows is its own.
#include <atomic>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "rpc/command_batch.h"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "coordinator/forwarding_worker_client.h"
#include "coordinator/grpc_worker_client.h"
#include "storage/spec_files.h"
#include "tests/integration/checkpoint_harness.h"
#include "tests/integration/in_process_coordinator.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// Passes every call on, except the first stage of a load after `armed` is
// set: that one goes out for a directory that does not exist, and its
// answer comes back without the worker's error.
class MisreportedStageClient final : public ForwardingWorkerClient {
 public:
  MisreportedStageClient(std::unique_ptr<WorkerClient> inner, std::atomic<bool>* armed)
      : ForwardingWorkerClient(std::move(inner)), armed_(armed) {}

  void Execute(const v1::CommandBatch* batch, absl::Time deadline, ExecuteDone done) override {
    const bool stage = batch->has_checkpoint() && batch->checkpoint().has_load_shard() &&
                       !batch->checkpoint().load_shard().apply();
    if (!stage || !armed_->exchange(false)) {
      ForwardingWorkerClient::Execute(batch, deadline, std::move(done));
      return;
    }
    auto sent = std::make_shared<v1::CommandBatch>(*batch);
    v1::CheckpointBatch::LoadShard& load = *sent->mutable_checkpoint()->mutable_load_shard();
    load.set_directory(load.directory() + "-not-there");
    absl::StatusOr<std::string> digest = BatchDigest(*sent);
    if (!digest.ok()) {
      done(digest.status());
      return;
    }
    sent->set_digest(*digest);
    ForwardingWorkerClient::Execute(
        sent.get(), deadline, [sent, done = std::move(done)](absl::StatusOr<v1::CommandResult> r) {
          // The worker refused the stage: NOT_FOUND, as the checkpoint
          // status of an answered batch. Dropped, it reads as staged.
          if (r.ok()) {
            EXPECT_TRUE(r->has_checkpoint_status()) << "the worker staged a directory not there";
            r->clear_checkpoint_status();
          }
          done(std::move(r));
        });
  }

 private:
  std::atomic<bool>* armed_;
};

TEST(HalfAppliedLoadTest, TheJobRecoversToItsRecoveryCheckpointAndReportsTheRefusal) {
  const std::string dir = testing::MakeTempDir("half-applied-load");
  const std::string checkpoints = dir + "/checkpoints";
  std::atomic<bool> armed{false};
  CoordinatorOptions options;
  options.job.checkpoint_root = checkpoints;
  options.job.connect = [&armed](const WorkerRecord& w,
                                 size_t world_size) -> std::unique_ptr<WorkerClient> {
    auto grpc = std::make_unique<GrpcWorkerClient>(w.address, nullptr, w.command_token,
                                                   WorkerChannelIdle(world_size));
    if (w.rank != 1) return grpc;
    return std::make_unique<MisreportedStageClient>(std::move(grpc), &armed);
  };
  auto coordinator = testing::InProcessCoordinator::Start(options);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status();
  std::vector<std::unique_ptr<ChildProcess>> workers;
  for (int i = 0; i < 2; ++i) {
    auto worker =
        ChildProcess::Spawn({std::string(FLATSHARD_BIN_DIR) + "/flatshard-worker", "--coordinator",
                             (*coordinator)->address(), "--rank", absl::StrCat(i), "--state-dir",
                             absl::StrCat(dir, "/worker-", i), "--checkpoint-dir", checkpoints,
                             "--metrics-listen", "", "--compute-threads", "1"});
    ASSERT_TRUE(worker.ok()) << worker.status();
    auto banner = (*worker)->ReadLine(absl::Seconds(60));  // registered and serving
    ASSERT_TRUE(banner.ok()) << banner.status();
    workers.push_back(*std::move(worker));
  }
  FlatshardClient client((*coordinator)->address());
  const std::string job = checkpoint_testing::kJob;
  ASSERT_TRUE(client.CreateJob(checkpoint_testing::Spec(2, true)).ok());
  ASSERT_TRUE(client.WaitForState(job, {v1::READY}, absl::Seconds(120)).ok());
  const auto save = [&client](const std::string& name) {
    absl::StatusOr<v1::CheckpointProgress> saved =
        checkpoint_testing::Save(client, name, v1::FULL_STATE_DICT);
    EXPECT_TRUE(saved.ok()) << saved.status();
  };
  checkpoint_testing::Train(client, 1);
  save("a");
  checkpoint_testing::Train(client, 2);
  save("b");  // step 3: the recovery checkpoint

  armed = true;
  absl::StatusOr<v1::CheckpointProgress> loaded = client.LoadCheckpoint(job, "a");
  ASSERT_FALSE(loaded.ok()) << "the load went through with rank 1 refusing its apply";
  EXPECT_FALSE(armed.load()) << "rank 1's stage was not intercepted";
  const std::string message(loaded.status().message());
  // The refusal names job rank 1: the misreporting client (chosen by the
  // daemon's --rank) is the one job rank 1's worker was reached through.
  EXPECT_THAT(message, HasSubstr("rank 1: "));
  EXPECT_THAT(message, HasSubstr("nothing is staged"));

  absl::StatusOr<v1::JobState> ready =
      client.WaitForState(job, {v1::READY}, absl::Seconds(120), {v1::RECOVERING});
  ASSERT_TRUE(ready.ok()) << ready.status();
  absl::StatusOr<v1::Job> after = client.GetJob(job);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->restarts(), 1);
  EXPECT_EQ(after->last_recovery().checkpoint(), "b");
  EXPECT_EQ(after->step(), 3);
  EXPECT_EQ(after->world_size(), 2);
  // Both ranks hold b's state again: a FULL save now is b, bit for bit
  // (rank 0's half of it would be a's had the job stayed as it was).
  save("restored");
  checkpoint_testing::ExpectSameTensors(
      checkpoint_testing::Dir(checkpoints, "b") + "/model.safetensors",
      checkpoint_testing::Dir(checkpoints, "restored") + "/model.safetensors");
  checkpoint_testing::Train(client, 1);

  coordinator->reset();  // the job's end first: the workers' calls into it return
  workers.clear();       // each is terminated (SIGTERM) and waited for
}

}  // namespace
}  // namespace flatshard
