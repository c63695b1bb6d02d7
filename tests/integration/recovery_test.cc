// Automatic recovery from a failed rank (issue #11, docs/fault-tolerance.md),
// with real coordinator and worker processes: a worker SIGKILLed in the middle
// of training is replaced by a spare, or the job shrinks to the largest valid
// world size, and the Train call in progress finishes its steps; the losses
// after the recovery equal, bit for bit, an uninterrupted run resumed from the
// same checkpoint at the same world size. Without restarts left the job FAILED
// says so, and a failure while the job is idle recovers on its own. Every
// worker lost at once is waited for (recovery.min_world_wait_s) and takes its
// seat back, as does a survivor that leaves during that wait; nobody back by
// then fails the job.
#include <chrono>
#include <csignal>
#include <future>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/recovery_harness.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// The demo job, checkpointing SHARDED every 3 steps, at world size 4.
v1::JobSpec RecoveringJob(int max_restarts, double spare_wait_s) {
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->mutable_checkpoints()->set_every_steps(3);
  spec->mutable_checkpoints()->set_keep_last(0);  // the resumed run loads the one recovery did
  spec->mutable_state_dict_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
  spec->mutable_recovery()->set_max_restarts(max_restarts);
  spec->mutable_recovery()->set_spare_wait_s(spare_wait_s);
  return *spec;
}

using testing::CreateAndWaitReady;
using testing::TrainAndKill;
using testing::TrainRun;
using testing::WorkerIndexOfRank;

std::unique_ptr<LocalCluster> StartCluster(int workers, const std::string& checkpoint_dir) {
  return testing::StartRecoveryCluster(workers, checkpoint_dir);
}

TEST(RecoveryTest, SpareTakesTheSeatAndTrainingFinishesBitExactWithAResumedRun) {
  const std::string dir = testing::MakeTempDir("recovery-spare");
  std::unique_ptr<LocalCluster> cluster = StartCluster(5, dir);  // 4 ranks + 1 spare
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  v1::JobSpec spec = RecoveringJob(/*max_restarts=*/3, /*spare_wait_s=*/30);
  CreateAndWaitReady(client, spec);

  TrainRun run = TrainAndKill(*cluster, client, spec.name(), 12, /*kill_after=*/5, {2});
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.recoveries_reported, 1);
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->step(), 12);
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_EQ(job->world_size(), 4);
  const v1::Recovery& r = job->last_recovery();
  EXPECT_THAT(r.failed_ranks(), ::testing::ElementsAre(2));
  EXPECT_TRUE(r.spare_used());
  EXPECT_EQ(r.world_size(), 4);
  EXPECT_EQ(r.resumed_step() % 3, 0);
  EXPECT_GE(r.resumed_step(), 3);
  EXPECT_LE(r.resumed_step(), r.failed_at_step());
  EXPECT_EQ(r.steps_lost(), r.failed_at_step() - r.resumed_step());
  EXPECT_EQ(r.checkpoint(), absl::StrFormat("step-%08d", r.resumed_step()));
  EXPECT_GT(job->epoch(), 1u);

  // The same job, created again without the schedule, loads that checkpoint
  // and trains the same steps uninterrupted: every loss is identical.
  ASSERT_TRUE(client.DeleteJob(spec.name()).ok());
  spec.mutable_checkpoints()->set_every_steps(0);
  CreateAndWaitReady(client, spec);
  auto loaded = client.LoadCheckpoint(spec.name(), r.checkpoint());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  std::map<int64_t, double> resumed;
  ASSERT_TRUE(client
                  .Train(spec.name(), 12 - r.resumed_step(), 0,
                         [&](const v1::StepResult& s) { resumed[s.step()] = s.loss(); })
                  .ok());
  ASSERT_EQ(resumed.size(), static_cast<size_t>(12 - r.resumed_step()));
  testing::ExpectSameLosses(run.loss_by_step, resumed);
}

TEST(RecoveryTest, WithoutASpareTheJobShrinksToTheLargestValidWorldSize) {
  const std::string dir = testing::MakeTempDir("recovery-shrink");
  std::unique_ptr<LocalCluster> cluster = StartCluster(4, dir);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = RecoveringJob(/*max_restarts=*/3, /*spare_wait_s=*/0.5);
  CreateAndWaitReady(client, spec);

  TrainRun run = TrainAndKill(*cluster, client, spec.name(), 10, /*kill_after=*/4, {1});
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->step(), 10);
  // 3 live workers, but a global batch of 32 does not split 3 ways: 2.
  EXPECT_EQ(job->world_size(), 2);
  EXPECT_EQ(job->spec().world_size(), 4);
  EXPECT_EQ(job->last_recovery().world_size(), 2);
  EXPECT_FALSE(job->last_recovery().spare_used());
  auto workers = client.ListWorkers(spec.name());
  ASSERT_TRUE(workers.ok());
  int ranked = 0;
  for (const v1::WorkerInfo& w : *workers) ranked += w.rank() >= 0 ? 1 : 0;
  EXPECT_EQ(ranked, 2);
}

TEST(RecoveryTest, AShrunkJobGrowsBackAtTheNextCheckpoint) {
  const std::string dir = testing::MakeTempDir("recovery-grow");
  std::unique_ptr<LocalCluster> cluster = StartCluster(4, dir);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = RecoveringJob(/*max_restarts=*/3, /*spare_wait_s=*/0.5);
  CreateAndWaitReady(client, spec);
  const int victim = WorkerIndexOfRank(*cluster, client, spec.name(), 1);
  TrainRun run = TrainAndKill(*cluster, client, spec.name(), 10, /*kill_after=*/4, {1});
  ASSERT_TRUE(run.status.ok()) << run.status;
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  ASSERT_EQ(job->world_size(), 2);  // shrunk: 3 live workers do not split a batch of 32
  const uint64_t shrunk_epoch = job->epoch();

  // The dead worker comes back under its id; with the idle survivor that makes
  // four. The next scheduled checkpoint (step 12) is the boundary.
  ASSERT_TRUE(cluster->RestartWorker(victim).ok());
  std::map<int64_t, int> ranks_by_step;
  ASSERT_TRUE(
      client
          .Train(spec.name(), 6, 0,
                 [&](const v1::StepResult& r) { ranks_by_step[r.step()] = r.rank_losses_size(); })
          .ok());
  job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->step(), 16);
  EXPECT_EQ(job->world_size(), 4);
  EXPECT_EQ(job->epoch(), shrunk_epoch + 1);
  EXPECT_EQ(job->restarts(), 1);  // growing is not a failure
  // Every step once, none lost: 11 and 12 at world size 2, then 4.
  ASSERT_EQ(ranks_by_step.size(), 6u);
  EXPECT_EQ(ranks_by_step[11], 2);
  EXPECT_EQ(ranks_by_step[12], 2);
  for (int64_t step = 13; step <= 16; ++step) EXPECT_EQ(ranks_by_step[step], 4) << step;
  std::string grew;
  (void)client.WatchEvents(spec.name(), [&](const v1::JobEvent& e) {
    if (e.message().find("grew back") != std::string::npos) grew = e.message();
    // Up to the IDLE that ends the training to step 16 (events replay from creation).
    return !(e.state() == v1::IDLE && e.message().find("step 16") != std::string::npos);
  });
  EXPECT_THAT(grew, HasSubstr("grew back to world size 4 at step 12 from checkpoint "
                              "step-00000012"));
}

// A job that loaded an older checkpoint left the history of the newer ones:
// a recovery restores the loaded one (or a save since), not the newest
// checkpoint of the abandoned history, which would jump the job forward to
// steps it never trained on this history.
TEST(RecoveryTest, AfterALoadARecoveryRestoresTheLoadedHistoryNotANewerOne) {
  const std::string dir = testing::MakeTempDir("recovery-after-load");
  std::unique_ptr<LocalCluster> cluster = StartCluster(5, dir);  // 4 ranks + 1 spare
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = RecoveringJob(/*max_restarts=*/3, /*spare_wait_s=*/30);
  CreateAndWaitReady(client, spec);
  ASSERT_TRUE(client.Train(spec.name(), 6, 0, [](const v1::StepResult&) {}).ok());
  auto loaded = client.LoadCheckpoint(spec.name(), "step-00000003");
  ASSERT_TRUE(loaded.ok()) << loaded.status();

  TrainRun run = TrainAndKill(*cluster, client, spec.name(), 4, /*kill_after=*/1, {2});
  ASSERT_TRUE(run.status.ok()) << run.status;
  EXPECT_EQ(run.recoveries_reported, 1);
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), 7);
  const v1::Recovery& r = job->last_recovery();
  EXPECT_EQ(r.checkpoint(), "step-00000003") << r.ShortDebugString();
  EXPECT_EQ(r.resumed_step(), 3);
  EXPECT_GE(r.steps_lost(), 0);
  // Step 6 of this history is saved beside the other history's.
  auto checkpoints = client.ListCheckpoints(spec.name());
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  std::vector<std::string> names;
  for (const v1::CheckpointInfo& c : *checkpoints) names.push_back(c.name());
  EXPECT_THAT(names, ::testing::Contains("step-00000006-2"));
}

TEST(RecoveryTest, NoRestartsLeftFailsTheJobSayingSo) {
  const std::string dir = testing::MakeTempDir("recovery-none");
  std::unique_ptr<LocalCluster> cluster = StartCluster(4, dir);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = RecoveringJob(/*max_restarts=*/0, /*spare_wait_s=*/0);
  CreateAndWaitReady(client, spec);
  TrainRun run = TrainAndKill(*cluster, client, spec.name(), 1000, /*kill_after=*/2, {3});
  EXPECT_FALSE(run.status.ok());
  EXPECT_THAT(std::string(run.status.message()), HasSubstr("recovery.max_restarts is 0"));
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_EQ(job->restarts(), 0);
}

TEST(RecoveryTest, AFailureWhileIdleRecoversWithoutAnOperation) {
  const std::string dir = testing::MakeTempDir("recovery-idle");
  std::unique_ptr<LocalCluster> cluster = StartCluster(5, dir);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = RecoveringJob(/*max_restarts=*/3, /*spare_wait_s=*/30);
  CreateAndWaitReady(client, spec);
  ASSERT_TRUE(client.Train(spec.name(), 4, 0, [](const v1::StepResult&) {}).ok());
  const int victim = WorkerIndexOfRank(*cluster, client, spec.name(), 0);
  ASSERT_GE(victim, 0);

  // Events replay from creation: wait for a RECOVERING, then the READY after it.
  std::promise<std::string> recovered;
  std::thread watch([&] {
    bool recovering = false;
    std::string ready_message;
    absl::Status watched = client.WatchEvents(spec.name(), [&](const v1::JobEvent& e) {
      recovering = recovering || e.state() == v1::RECOVERING;
      if (recovering && e.state() == v1::READY) {
        ready_message = e.message();
        return false;
      }
      return e.state() != v1::FAILED && e.state() != v1::STOPPED;
    });
    recovered.set_value(ready_message.empty()
                            ? "no recovery seen; the watch ended: " + watched.ToString()
                            : ready_message);
  });
  cluster->worker(victim).Signal(SIGKILL);
  std::future<std::string> message = recovered.get_future();
  // The heartbeat timeout (2 s) detects it; the rest is one re-form and restore.
  if (message.wait_for(std::chrono::seconds(90)) != std::future_status::ready) {
    cluster.reset();  // the coordinator's exit ends the watch
    watch.join();
    FAIL() << "no recovery within 90 s";
  }
  const std::string text = message.get();
  watch.join();
  EXPECT_THAT(text, HasSubstr("recovered"));
  EXPECT_THAT(text, HasSubstr("from checkpoint step-00000003"));
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_EQ(job->step(), 3);
  EXPECT_EQ(job->world_size(), 4);
  EXPECT_THAT(job->last_recovery().cause(), HasSubstr("missed heartbeats"));
  // And it trains again.
  EXPECT_TRUE(client.Train(spec.name(), 2, 0, [](const v1::StepResult&) {}).ok());
}

// Every worker of the job lost at once (a whole node rebooting, the
// coordinator's own link down): too few are live to re-form at all, so the
// recovery goes on waiting past spare_wait_s (recovery.min_world_wait_s),
// says so, and re-forms on the same workers, rank for rank, once their
// daemons are back; the Train call in progress finishes its steps.
TEST(RecoveryTest, EveryWorkerLostIsWaitedForAndTrainingGoesOnWhenTheyReturn) {
  const std::string dir = testing::MakeTempDir("recovery-everyone");
  std::unique_ptr<LocalCluster> cluster = StartCluster(2, dir);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  // Once one is back, the other has this long to follow before the job
  // re-forms without it (the restarts here are a banner apart, longer under
  // a sanitizer on a loaded machine).
  constexpr double kSpareWaitS = 8;
  v1::JobSpec spec = RecoveringJob(/*max_restarts=*/3, kSpareWaitS);
  spec.set_world_size(2);
  spec.mutable_recovery()->set_min_world_wait_s(120);
  CreateAndWaitReady(client, spec);

  // Trained on another thread. This one, which outlives the restarted
  // daemons (PR_SET_PDEATHSIG follows the spawning thread), kills both once
  // step 4 is in and starts them again under their ids once the recovery
  // says it waits for workers, as their supervisor would.
  std::promise<void> step4;
  std::future<absl::Status> training = std::async(std::launch::async, [&] {
    int seen = 0;
    return client.Train(spec.name(), 9, 0, [&](const v1::StepResult& r) {
      if (r.has_recovery()) std::cerr << "recovered: " << r.recovery().ShortDebugString() << "\n";
      if (++seen == 4) step4.set_value();
    });
  });
  ASSERT_EQ(step4.get_future().wait_for(std::chrono::seconds(120)), std::future_status::ready)
      << "training never reached step 4";
  cluster->worker(0).Signal(SIGKILL);
  cluster->worker(1).Signal(SIGKILL);
  absl::Status restarted = absl::NotFoundError("the recovery never said it waits for workers");
  std::string waiting;
  // Also ended by the training's end without that wait (IDLE) or a FAILED job.
  const absl::Status watched = client.WatchEvents(spec.name(), [&](const v1::JobEvent& e) {
    if (e.state() == v1::RECOVERING && absl::StrContains(e.message(), "min_world_wait_s")) {
      waiting = e.message();
      restarted = cluster->RestartWorker(0);
      if (restarted.ok()) restarted = cluster->RestartWorker(1);
      return false;
    }
    return e.state() != v1::FAILED && e.state() != v1::STOPPED && e.state() != v1::IDLE;
  });
  if (!watched.ok()) restarted.Update(watched);
  const absl::Status trained = training.get();
  ASSERT_TRUE(restarted.ok()) << restarted;
  EXPECT_THAT(waiting, HasSubstr("cannot re-form on the 0 live worker(s) (world size 2, "
                                 "recovery.min_world_size 1): waiting up to "));
  ASSERT_TRUE(trained.ok()) << trained;
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), 9);
  EXPECT_EQ(job->world_size(), 2);
  EXPECT_EQ(job->restarts(), 1);
  const v1::Recovery& r = job->last_recovery();
  EXPECT_THAT(r.failed_ranks(), ::testing::ElementsAre(0, 1));
  EXPECT_FALSE(r.spare_used());
  EXPECT_EQ(r.world_size(), 2);
  EXPECT_GT(r.seconds(), kSpareWaitS) << "it re-formed within spare_wait_s, with nobody back?";
  EXPECT_EQ(r.resumed_step() % 3, 0);
  EXPECT_GE(r.resumed_step(), 3);
  // The same workers, rank for rank, at their new addresses.
  EXPECT_EQ(WorkerIndexOfRank(*cluster, client, spec.name(), 0), 0);
  EXPECT_EQ(WorkerIndexOfRank(*cluster, client, spec.name(), 1), 1);
}

// A survivor that leaves while the recovery waits for the minimum (its node
// reboots too) is not seated with its stale record, where its Configure
// would fail and spend a restart: it takes its seat back at its new
// address, and the recovery lists it among the failed ranks.
TEST(RecoveryTest, ASurvivorRestartedDuringTheWaitTakesItsSeatBackAndCountsAsFailed) {
  const std::string dir = testing::MakeTempDir("recovery-survivor-left");
  std::unique_ptr<LocalCluster> cluster = StartCluster(2, dir);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  constexpr double kSpareWaitS = 8;  // the second restart follows the first within it
  v1::JobSpec spec = RecoveringJob(/*max_restarts=*/3, kSpareWaitS);
  spec.set_world_size(2);
  spec.mutable_recovery()->set_min_world_size(2);  // the survivor alone cannot re-form
  spec.mutable_recovery()->set_min_world_wait_s(120);
  CreateAndWaitReady(client, spec);
  ASSERT_TRUE(client.Train(spec.name(), 4, 0, [](const v1::StepResult&) {}).ok());
  const int survivor = WorkerIndexOfRank(*cluster, client, spec.name(), 0);
  const int victim = WorkerIndexOfRank(*cluster, client, spec.name(), 1);
  ASSERT_GE(survivor, 0);
  ASSERT_GE(victim, 0);

  cluster->worker(victim).Signal(SIGKILL);
  // Once the recovery waits for the minimum, the survivor's daemon dies and
  // both are started again under their ids, the survivor first.
  absl::Status restarted = absl::NotFoundError("the recovery never said it waits for workers");
  const absl::Status watched = client.WatchEvents(spec.name(), [&](const v1::JobEvent& e) {
    if (e.state() == v1::RECOVERING && absl::StrContains(e.message(), "min_world_wait_s")) {
      cluster->worker(survivor).Signal(SIGKILL);
      restarted = cluster->worker(survivor).Wait(absl::Seconds(30)).has_value()
                      ? cluster->RestartWorker(survivor)
                      : absl::DeadlineExceededError("the survivor's daemon outlived SIGKILL");
      if (restarted.ok()) restarted = cluster->RestartWorker(victim);
      return false;
    }
    return e.state() != v1::FAILED && e.state() != v1::STOPPED;
  });
  if (!watched.ok()) restarted.Update(watched);
  ASSERT_TRUE(restarted.ok()) << restarted;
  auto ready = client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(120), {v1::RECOVERING});
  ASSERT_TRUE(ready.ok()) << ready.status();
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->restarts(), 1) << "the stale survivor was seated";
  EXPECT_EQ(job->world_size(), 2);
  const v1::Recovery& r = job->last_recovery();
  EXPECT_THAT(r.failed_ranks(), ::testing::ElementsAre(0, 1));
  EXPECT_EQ(r.resumed_step(), 3);
  EXPECT_EQ(WorkerIndexOfRank(*cluster, client, spec.name(), 0), survivor);
  EXPECT_EQ(WorkerIndexOfRank(*cluster, client, spec.name(), 1), victim);
  EXPECT_TRUE(client.Train(spec.name(), 2, 0, [](const v1::StepResult&) {}).ok());
}

// Nobody back within recovery.min_world_wait_s: the job is FAILED, after
// that wait and not at the end of spare_wait_s, saying how long it waited.
TEST(RecoveryTest, EveryWorkerLostForLongerThanTheWaitFailsTheJobSayingSo) {
  const std::string dir = testing::MakeTempDir("recovery-nobody");
  std::unique_ptr<LocalCluster> cluster = StartCluster(2, dir);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  constexpr double kWaitS = 3;
  v1::JobSpec spec = RecoveringJob(/*max_restarts=*/3, /*spare_wait_s=*/0.5);
  spec.set_world_size(2);
  spec.mutable_recovery()->set_min_world_wait_s(kWaitS);
  CreateAndWaitReady(client, spec);
  const absl::Time killed = absl::Now();
  cluster->worker(0).Signal(SIGKILL);
  cluster->worker(1).Signal(SIGKILL);
  // The heartbeat timeout (2 s) detects it; then the recovery waits kWaitS.
  auto failed = client.WaitForState(spec.name(), {v1::FAILED}, absl::Seconds(60));
  ASSERT_TRUE(failed.ok()) << failed.status();
  const absl::Duration took = absl::Now() - killed;
  EXPECT_GE(took, absl::Seconds(kWaitS)) << "it did not wait for the workers";
  EXPECT_LT(took, absl::Seconds(30));
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_THAT(job->failure(), HasSubstr("of waiting for workers (recovery.spare_wait_s 0.5, "
                                        "recovery.min_world_wait_s 3): cannot re-form: 0 "
                                        "surviving worker(s) and 0 spare(s)"));
}

}  // namespace
}  // namespace flatshard
