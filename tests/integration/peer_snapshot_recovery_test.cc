// Recovery from in-memory peer snapshots with real coordinator and worker
// processes (issue #11 §5, docs/fault-tolerance.md): with
// checkpoints.in_memory_every_steps 1 and no disk checkpoint at all, a worker
// SIGKILLed mid-training costs one step (two when the last generation's
// exchange, which runs during the next step, had not finished: under CPU
// contention, ctest -j2 on 2 cores; the fault suite measures the typical
// case), not everything since initialization; with a spare the losses
// afterwards equal an uninterrupted run's bit for bit; without one the job
// reshards in memory to a smaller world; two adjacent ranks lost at once fall
// back to the last disk checkpoint; a coordinator restarted right after such
// a recovery re-adopts the ranks at the restored step.
#include <cmath>
#include <csignal>
#include <map>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "coordinator/grpc_worker_client.h"
#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/recovery_harness.h"

namespace flatshard {
namespace {

using testing::CreateAndWaitReady;
using testing::StartRecoveryCluster;
using testing::TrainAndKill;
using testing::TrainRun;

// The demo job with a peer snapshot after every step; disk checkpoints only
// every `every_steps` (0: none).
v1::JobSpec SnapshottingJob(double spare_wait_s, int64_t every_steps) {
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_checkpoints()->set_every_steps(every_steps);
  spec->mutable_checkpoints()->set_in_memory_every_steps(1);
  spec->mutable_recovery()->set_max_restarts(3);
  spec->mutable_recovery()->set_spare_wait_s(spare_wait_s);
  return *spec;
}

// The same job trained `steps` without a failure: the losses by step.
std::map<int64_t, double> Uninterrupted(FlatshardClient& client, const v1::JobSpec& spec,
                                        int64_t steps) {
  CreateAndWaitReady(client, spec);
  std::map<int64_t, double> losses;
  EXPECT_TRUE(client
                  .Train(spec.name(), steps, 0,
                         [&](const v1::StepResult& r) { losses[r.step()] = r.loss(); })
                  .ok());
  EXPECT_TRUE(client.DeleteJob(spec.name()).ok());
  return losses;
}

TEST(PeerSnapshotRecoveryTest, ASpareResumesFromMemoryBitExactLosingAStepOrTwo) {
  const std::string dir = testing::MakeTempDir("peer-recovery-spare");
  std::unique_ptr<LocalCluster> cluster = StartRecoveryCluster(5, dir);  // 4 ranks + 1 spare
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = SnapshottingJob(/*spare_wait_s=*/30, /*every_steps=*/0);
  const std::map<int64_t, double> reference = Uninterrupted(client, spec, 10);
  ASSERT_EQ(reference.size(), 10u);

  CreateAndWaitReady(client, spec);
  TrainRun run = TrainAndKill(*cluster, client, spec.name(), 10, /*kill_after=*/4, {2});
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.recoveries_reported, 1);
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->step(), 10);
  EXPECT_EQ(job->world_size(), 4);
  const v1::Recovery& r = job->last_recovery();
  EXPECT_TRUE(r.from_peer_snapshot()) << r.ShortDebugString();
  EXPECT_EQ(r.checkpoint(), "");  // there is none: every_steps is 0
  EXPECT_TRUE(r.spare_used());
  // Step 4's copies may still have been in flight, and under load step 3's.
  EXPECT_GE(r.resumed_step(), 2);
  EXPECT_LE(r.steps_lost(), 2);
  // Every loss, before and after the recovery, is the uninterrupted run's.
  testing::ExpectSameLosses(run.loss_by_step, reference);
}

TEST(PeerSnapshotRecoveryTest, WithoutASpareTheJobReshardsInMemoryToASmallerWorld) {
  const std::string dir = testing::MakeTempDir("peer-recovery-shrink");
  std::unique_ptr<LocalCluster> cluster = StartRecoveryCluster(4, dir);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = SnapshottingJob(/*spare_wait_s=*/0.5, /*every_steps=*/0);
  const std::map<int64_t, double> reference = Uninterrupted(client, spec, 10);

  CreateAndWaitReady(client, spec);
  TrainRun run = TrainAndKill(*cluster, client, spec.name(), 10, /*kill_after=*/4, {1});
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->step(), 10);
  EXPECT_EQ(job->world_size(), 2);  // 3 live workers do not split a batch of 32
  const v1::Recovery& r = job->last_recovery();
  EXPECT_TRUE(r.from_peer_snapshot()) << r.ShortDebugString();
  EXPECT_LE(r.steps_lost(), 2);
  // The same state at another world size: the losses go on as the
  // uninterrupted run's, to the rounding of another reduction order.
  for (int64_t step = r.resumed_step() + 1; step <= 10; ++step) {
    ASSERT_TRUE(run.loss_by_step.contains(step)) << step;
    EXPECT_NEAR(run.loss_by_step[step], reference.at(step), 1e-4 * std::abs(reference.at(step)))
        << "step " << step;
  }
}

TEST(PeerSnapshotRecoveryTest, TwoAdjacentRanksLostFallBackToTheCheckpoint) {
  const std::string dir = testing::MakeTempDir("peer-recovery-adjacent");
  std::unique_ptr<LocalCluster> cluster = StartRecoveryCluster(4, dir);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = SnapshottingJob(/*spare_wait_s=*/0.5, /*every_steps=*/3);
  CreateAndWaitReady(client, spec);
  // Rank 1's copy lives on rank 2: losing both loses rank 1's state.
  TrainRun run = TrainAndKill(*cluster, client, spec.name(), 10, /*kill_after=*/5, {1, 2});
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->step(), 10);
  EXPECT_EQ(job->world_size(), 2);
  const v1::Recovery& r = job->last_recovery();
  EXPECT_FALSE(r.from_peer_snapshot()) << r.ShortDebugString();
  EXPECT_EQ(r.resumed_step() % 3, 0);
  EXPECT_THAT(r.checkpoint(), ::testing::StartsWith("step-"));
}

// The coordinator killed after an idle job recovered from peer snapshots,
// before any other batch: the journal's last batch is that restore, which
// moved the ranks back to the snapshot's step. The restarted coordinator
// re-adopts them there, not at the step the job had failed at (it did, and
// then trained steps the ranks never ran).
TEST(PeerSnapshotRecoveryTest, ACoordinatorRestartedAfterARestoreFromMemoryReadoptsAtItsStep) {
  const std::string dir = testing::MakeTempDir("peer-recovery-restart");
  std::unique_ptr<LocalCluster> cluster = StartRecoveryCluster(3, dir);  // 2 ranks + 1 spare
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  v1::JobSpec spec = SnapshottingJob(/*spare_wait_s=*/30, /*every_steps=*/0);
  spec.set_world_size(2);
  spec.mutable_checkpoints()->set_in_memory_every_steps(3);  // step 3's, then failed at step 4
  CreateAndWaitReady(client, spec);
  ASSERT_TRUE(client.Train(spec.name(), 4, 0, [](const v1::StepResult&) {}).ok());
  const int survivor = testing::WorkerIndexOfRank(*cluster, client, spec.name(), 0);
  const int victim = testing::WorkerIndexOfRank(*cluster, client, spec.name(), 1);
  ASSERT_GE(survivor, 0);
  ASSERT_GE(victim, 0);
  // Step 3's copies are exchanged in the background, during step 4 and
  // after it: the kill waits until rank 0 holds rank 1's (bounded polls).
  GrpcWorkerClient rank0(cluster->worker_addresses()[static_cast<size_t>(survivor)], nullptr,
                         cluster->command_token());
  const auto holds_rank1_copy = [&] {
    auto status = rank0.GetStatus(absl::Now() + absl::Seconds(2));
    if (!status.ok()) return false;
    for (const v1::PeerSnapshotHeld& held : status->peer_snapshots()) {
      if (held.step() == 3 && held.rank() == 1 && !held.own()) return true;
    }
    return false;
  };
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  bool held = holds_rank1_copy();
  while (!held && absl::Now() < deadline) held = holds_rank1_copy();
  ASSERT_TRUE(held) << "rank 0 never held rank 1's copy of step 3";
  cluster->worker(victim).Signal(SIGKILL);
  auto recovered =
      client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(120), {v1::RECOVERING});
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  auto before = client.GetJob(spec.name());
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(before->last_recovery().from_peer_snapshot())
      << before->last_recovery().ShortDebugString();
  ASSERT_EQ(before->step(), 3);

  ASSERT_TRUE(cluster->KillAndRestartCoordinator().ok());
  FlatshardClient again(cluster->address());
  std::string events;  // up to the first READY after the restart
  (void)again.WatchEvents(spec.name(), [&](const v1::JobEvent& e) {
    events += v1::JobState_Name(e.state()) + ": " + e.message() + "\n";
    return e.state() != v1::READY && e.state() != v1::FAILED;
  });
  EXPECT_THAT(events, ::testing::HasSubstr("re-adopted 2 workers of epoch"));
  auto after = again.GetJob(spec.name());
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->step(), 3) << events;
  EXPECT_EQ(after->epoch(), before->epoch());
  // And it trains on from there.
  std::map<int64_t, double> losses;
  ASSERT_TRUE(
      again.Train(spec.name(), 2, 0, [&](const v1::StepResult& r) { losses[r.step()] = r.loss(); })
          .ok());
  EXPECT_EQ(losses.begin()->first, 4);
  EXPECT_EQ(losses.rbegin()->first, 5);
}

}  // namespace
}  // namespace flatshard
