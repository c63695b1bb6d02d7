// A coordinator killed with SIGKILL and started again on the same state dir
// (issue #11 §2, docs/fault-tolerance.md), with real coordinator and worker
// processes and a real SQLite state store. The workers keep their shards; the
// restarted coordinator finds the job in its state store, the ranks report
// the epoch and seq they reached, and it takes them back. Whatever the moment
// of the kill, no step is lost or applied twice: the losses after the restart
// equal, bit for bit, those of an uninterrupted run at the same steps.
#include <csignal>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "coordinator/grpc_worker_client.h"
#include "coordinator/state_store.h"
#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 2;

LocalClusterOptions ClusterOptions(const std::string& dir) {
  LocalClusterOptions options;
  options.workers = kWorld;
  options.bin_dir = FLATSHARD_BIN_DIR;
  options.heartbeat_interval_s = 0.25;
  options.heartbeat_timeout_s = 2.0;
  options.checkpoint_dir = dir + "/checkpoints";
  options.state_dir = dir + "/state";
  return options;
}

std::unique_ptr<LocalCluster> StartCluster(const std::string& dir) {
  auto cluster = LocalCluster::Start(ClusterOptions(dir));
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

v1::JobSpec Job() {
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->set_world_size(kWorld);
  spec->mutable_checkpoints()->set_every_steps(4);
  spec->mutable_state_dict_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
  return *spec;
}

void CreateAndWaitReady(FlatshardClient& client, const v1::JobSpec& spec) {
  ASSERT_TRUE(client.CreateJob(spec).ok());
  auto ready = client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(120));
  ASSERT_TRUE(ready.ok()) << ready.status();
}

// Trains `steps` more, recording each step's loss; `after_step` runs after
// each result (the kill).
absl::Status TrainSteps(FlatshardClient& client, const std::string& job, int64_t steps,
                        std::map<int64_t, double>* losses,
                        const std::function<void(int64_t)>& after_step = {}, int micro_steps = 0) {
  return client.Train(job, steps, micro_steps, [&](const v1::StepResult& r) {
    (*losses)[r.step()] = r.loss();
    if (after_step) after_step(r.step());
  });
}

// Creates the job and trains `steps`, SIGKILLing the coordinator once step
// 5's result is in; the stream is cut.
void CreateAndKillTheCoordinatorAtStep5(LocalCluster& cluster, const v1::JobSpec& spec,
                                        int64_t steps, std::map<int64_t, double>* losses) {
  FlatshardClient client(cluster.address());
  CreateAndWaitReady(client, spec);
  const absl::Status cut = TrainSteps(client, spec.name(), steps, losses, [&](int64_t step) {
    if (step == 5) cluster.coordinator().Signal(SIGKILL);
  });
  EXPECT_EQ(cut.code(), absl::StatusCode::kUnavailable) << cut;
}

std::string Events(FlatshardClient& client, const std::string& job) {
  std::string all;
  (void)client.WatchEvents(job, [&](const v1::JobEvent& e) {
    all += v1::JobState_Name(e.state()) + ": " + e.message() + "\n";
    return e.state() != v1::READY;  // up to the first READY after the restart
  });
  return all;
}

// The model's parameters, bit for bit, by name.
std::map<std::string, std::string> Parameters(FlatshardClient& client, const std::string& job) {
  std::map<std::string, std::string> out;
  const absl::Status status = client.SummonFullParams(job, false, 0, [&](const v1::TensorChunk& c) {
    out[c.fqn()] += c.data();
    return absl::OkStatus();
  });
  EXPECT_TRUE(status.ok()) << status;
  return out;
}

// Whether rank 0's heartbeats report `state` within 30 s (bounded polls of a
// condition).
bool Rank0Reports(FlatshardClient& client, const std::string& state) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    auto workers = client.ListWorkers();
    if (!workers.ok()) return false;
    for (const v1::WorkerInfo& w : *workers) {
      if (w.rank() == 0 && w.state() == state) return true;
    }
  }
  return false;
}

// The uninterrupted run the tests compare with: 12 steps on a fresh cluster
// (each of `micro_steps` no_sync micro-batches and a synced one).
struct Reference {
  std::map<int64_t, double> losses;
  std::map<std::string, std::string> parameters;  // at step 12
};
Reference RunUninterrupted(int micro_steps) {
  Reference out;
  std::unique_ptr<LocalCluster> cluster = StartCluster(testing::MakeTempDir("restart-ref"));
  if (cluster == nullptr) return out;
  FlatshardClient client(cluster->address());
  CreateAndWaitReady(client, Job());
  EXPECT_TRUE(TrainSteps(client, Job().name(), 12, &out.losses, {}, micro_steps).ok());
  out.parameters = Parameters(client, Job().name());
  return out;
}
const Reference& Uninterrupted() {
  static const Reference reference = RunUninterrupted(0);
  return reference;
}

// After a restart the training operation goes on by itself to step 12: the
// job ends IDLE there with the same parameters as the uninterrupted run.
void ExpectTrainedTo12LikeTheReference(FlatshardClient& client, const std::string& job,
                                       const Reference& reference = Uninterrupted()) {
  auto idle = client.WaitForState(job, {v1::IDLE}, absl::Seconds(120));
  ASSERT_TRUE(idle.ok()) << idle.status();
  auto status = client.GetJob(job);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->step(), 12);
  EXPECT_FALSE(status->training().running());
  EXPECT_EQ(status->training().outcome(), "trained to step 12");
  const auto parameters = Parameters(client, job);
  ASSERT_FALSE(parameters.empty());
  EXPECT_TRUE(parameters == reference.parameters) << "the parameters differ at step 12";
}

TEST(CoordinatorRestartTest, IdleJobIsReadoptedWithNoStepLost) {
  const std::string dir = testing::MakeTempDir("restart-idle");
  std::unique_ptr<LocalCluster> cluster = StartCluster(dir);
  ASSERT_NE(cluster, nullptr);
  const v1::JobSpec spec = Job();
  std::map<int64_t, double> losses;
  {
    FlatshardClient client(cluster->address());
    CreateAndWaitReady(client, spec);
    ASSERT_TRUE(TrainSteps(client, spec.name(), 6, &losses).ok());
  }
  ASSERT_TRUE(cluster->KillAndRestartCoordinator().ok());
  FlatshardClient client(cluster->address());
  auto ready = client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(60));
  ASSERT_TRUE(ready.ok()) << ready.status();
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), 6);
  EXPECT_EQ(job->epoch(), 1u);  // the same epoch: re-adopted, not re-formed
  EXPECT_EQ(job->restarts(), 0);
  EXPECT_THAT(Events(client, spec.name()), HasSubstr("re-adopted 2 workers of epoch 1"));
  ASSERT_TRUE(TrainSteps(client, spec.name(), 6, &losses).ok());
  ASSERT_EQ(losses.size(), 12u);
  const std::map<int64_t, double>& reference = Uninterrupted().losses;
  ASSERT_EQ(reference.size(), 12u);
  for (const auto& [step, loss] : losses) {
    EXPECT_EQ(loss, reference.at(step)) << "step " << step;  // bit for bit
  }
  // The checkpoints taken before the kill are still in the catalog.
  auto checkpoints = client.ListCheckpoints(spec.name());
  ASSERT_TRUE(checkpoints.ok());
  EXPECT_EQ(checkpoints->size(), 3u);  // steps 4, 8, 12
  EXPECT_TRUE(cluster->Stop());
}

// A scheduled save inside a training operation names the ranks' state in the
// store (no state transition writes it there), and the next step's batch
// clears it before it is sent: a coordinator killed after that step does
// not come back taking the trained state for the checkpoint.
TEST(CoordinatorRestartTest, AScheduledSaveNamesTheStateOnlyUntilTheNextStep) {
  const std::string dir = testing::MakeTempDir("restart-named");
  std::unique_ptr<LocalCluster> cluster = StartCluster(dir);
  ASSERT_NE(cluster, nullptr);
  const v1::JobSpec spec = Job();  // a checkpoint every 4 steps
  std::map<int64_t, double> losses;
  // Far from its end at the kill: the operation is still running, and goes
  // on after the restart (to 6 it could end before the kill lands, and the
  // job would come back READY, never IDLE).
  ASSERT_NO_FATAL_FAILURE(CreateAndKillTheCoordinatorAtStep5(*cluster, spec, 10, &losses));
  std::string stored = "(not read)";
  ASSERT_TRUE(cluster
                  ->KillAndRestartCoordinator([&] {
                    auto store = StateStore::Open(dir + "/state");
                    ASSERT_TRUE(store.ok()) << store.status();
                    auto jobs = (*store)->LoadJobs();
                    ASSERT_TRUE(jobs.ok() && jobs->size() == 1u) << jobs.status();
                    stored = (*jobs)[0].state_checkpoint;
                  })
                  .ok());
  EXPECT_EQ(stored, "");
  FlatshardClient client(cluster->address());
  auto idle = client.WaitForState(spec.name(), {v1::IDLE}, absl::Seconds(120));
  ASSERT_TRUE(idle.ok()) << idle.status();
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), 10);
  EXPECT_EQ(job->state_checkpoint(), "");  // step 8 saved, 9 and 10 trained
  EXPECT_TRUE(cluster->Stop());
}

// The whole cluster stopped and started again on its state dir, as a second
// `flatshard up` does: the new worker daemons prove their ids with the
// secrets kept in the state dir's worker-seats/ (before, the coordinator
// kept the restored seats for the old daemons and refused them, and the
// cluster did not start). They hold no shards, so the job rolls back to its
// last checkpoint (step 4) and trains on from there like the uninterrupted run.
TEST(CoordinatorRestartTest, AClusterStartedAgainOnItsStateDirTakesItsJobBack) {
  const std::string dir = testing::MakeTempDir("restart-cluster");
  const v1::JobSpec spec = Job();
  {
    std::unique_ptr<LocalCluster> cluster = StartCluster(dir);
    ASSERT_NE(cluster, nullptr);
    FlatshardClient client(cluster->address());
    CreateAndWaitReady(client, spec);
    std::map<int64_t, double> before;
    ASSERT_TRUE(TrainSteps(client, spec.name(), 6, &before).ok());
    EXPECT_TRUE(cluster->Stop());
  }
  std::unique_ptr<LocalCluster> cluster = StartCluster(dir);
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  auto ready = client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(120));
  ASSERT_TRUE(ready.ok()) << ready.status();
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), 4);
  std::map<int64_t, double> losses;
  ASSERT_TRUE(TrainSteps(client, spec.name(), 8, &losses).ok());
  ASSERT_EQ(losses.size(), 8u);
  const std::map<int64_t, double>& reference = Uninterrupted().losses;
  for (const auto& [step, loss] : losses) {
    EXPECT_EQ(loss, reference.at(step)) << "step " << step;  // bit for bit
  }
  EXPECT_TRUE(cluster->Stop());
}

TEST(CoordinatorRestartTest, KilledMidTrainingGoesOnFromWhereTheRanksAre) {
  const std::string dir = testing::MakeTempDir("restart-busy");
  std::unique_ptr<LocalCluster> cluster = StartCluster(dir);
  ASSERT_NE(cluster, nullptr);
  const v1::JobSpec spec = Job();
  std::map<int64_t, double> losses;
  // Killed while the stream runs: the next step's batch may be anywhere.
  ASSERT_NO_FATAL_FAILURE(CreateAndKillTheCoordinatorAtStep5(*cluster, spec, 12, &losses));
  ASSERT_TRUE(cluster->KillAndRestartCoordinator().ok());
  FlatshardClient client(cluster->address());
  const std::string events = Events(client, spec.name());
  std::cerr << events;
  // Re-adopted at the step the ranks reached, or rolled back to step 4.
  EXPECT_THAT(events, ::testing::AnyOf(HasSubstr("re-adopted 2 workers of epoch 1"),
                                       HasSubstr("cannot re-adopt epoch 1")));
  ExpectTrainedTo12LikeTheReference(client, spec.name());
  for (const auto& [step, loss] : losses) {
    EXPECT_EQ(loss, Uninterrupted().losses.at(step)) << "step " << step;
  }
  EXPECT_TRUE(cluster->Stop());
}

// The same with no_sync micro-batches (7 a step, then the synced one): the
// kill most often falls between a step's micro-batches, where the ranks hold
// gradients a restarted step would add to again. The coordinator re-adopts
// only at a step boundary and otherwise rolls back, so whichever it was the
// run ends with the uninterrupted run's losses and parameters.
TEST(CoordinatorRestartTest, KilledBetweenMicroBatchesLosesNoGradientAndAddsNone) {
  const std::string dir = testing::MakeTempDir("restart-micro");
  std::unique_ptr<LocalCluster> cluster = StartCluster(dir);
  ASSERT_NE(cluster, nullptr);
  const v1::JobSpec spec = Job();
  std::map<int64_t, double> losses;
  {
    FlatshardClient client(cluster->address());
    CreateAndWaitReady(client, spec);
    // Killed once rank 0 reports a batch of step 6 running: by then the
    // step is most often part way through.
    const absl::Status cut = TrainSteps(
        client, spec.name(), 12, &losses,
        [&](int64_t step) {
          if (step != 5) return;
          (void)Rank0Reports(client, "running");
          cluster->coordinator().Signal(SIGKILL);
        },
        /*micro_steps=*/7);
    EXPECT_EQ(cut.code(), absl::StatusCode::kUnavailable) << cut;
  }
  ASSERT_TRUE(cluster->KillAndRestartCoordinator().ok());
  FlatshardClient client(cluster->address());
  const std::string events = Events(client, spec.name());
  std::cerr << events;
  // Re-adopted at a step boundary, or rolled back to step 4: from step 5, or
  // from step 6 when the kill landed after it (a loaded machine; seen under
  // ctest -j2). The losses and parameters below are the proof either way.
  EXPECT_THAT(events, ::testing::AnyOf(HasSubstr("re-adopted 2 workers of epoch 1"),
                                       HasSubstr("from checkpoint step-00000004, 1 step(s) lost"),
                                       HasSubstr("from checkpoint step-00000004, 2 step(s) lost")));
  const Reference reference = RunUninterrupted(7);
  ExpectTrainedTo12LikeTheReference(client, spec.name(), reference);
  for (const auto& [step, loss] : losses) {
    EXPECT_EQ(loss, reference.losses.at(step)) << "step " << step;
  }
  EXPECT_TRUE(cluster->Stop());
}

// The coordinator dies with a step's batch delivered to rank 0 only (rank 1
// is stopped): rank 0 waits in a collective for rank 1. It aborts the batch
// once its coordinator has been silent for --coordinator-timeout (2 s), well
// before the 120 s collective timeout; the restarted coordinator finds the
// ranks disagree and rolls back to the step-4 checkpoint.
TEST(CoordinatorRestartTest, ABatchHalfDeliveredIsAbortedAndRolledBack) {
  const std::string dir = testing::MakeTempDir("restart-half");
  LocalClusterOptions options = ClusterOptions(dir);
  options.heartbeat_timeout_s = 15;  // the stopped rank is not failed before the kill
  options.coordinator_timeout_s = 2;
  options.collective_timeout_s = 120;
  auto started = LocalCluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<LocalCluster> cluster = *std::move(started);
  const v1::JobSpec spec = Job();
  std::map<int64_t, double> losses;
  {
    FlatshardClient client(cluster->address());
    CreateAndWaitReady(client, spec);
    ASSERT_TRUE(TrainSteps(client, spec.name(), 5, &losses).ok());
    ASSERT_TRUE(Rank0Reports(client, "ready"));  // past the first Train's last batch
    cluster->worker(1).Signal(SIGSTOP);
    absl::Status cut;
    std::thread train([&] { cut = TrainSteps(client, spec.name(), 7, &losses); });
    const bool running = Rank0Reports(client, "running");  // step 6's batch
    if (!running) {
      cluster->worker(1).Signal(SIGCONT);
      train.join();
      FAIL() << "rank 0 never ran the batch";
    }
    cluster->coordinator().Signal(SIGKILL);
    train.join();
    EXPECT_EQ(cut.code(), absl::StatusCode::kUnavailable) << cut;
  }
  const absl::Time killed = absl::Now();
  {
    // With its coordinator silent, rank 0 aborts the batch by itself (asked
    // directly: there is no coordinator to report to).
    GrpcWorkerClient rank0(cluster->worker_addresses()[0], nullptr, cluster->command_token());
    bool aborted = false;
    while (!aborted && absl::Now() - killed < absl::Seconds(30)) {
      auto status = rank0.GetStatus(absl::Now() + absl::Seconds(1));
      aborted = status.ok() && status->state() == "aborted";
    }
    EXPECT_TRUE(aborted) << "rank 0 still waits in its collective";
    EXPECT_LT(absl::Now() - killed, absl::Seconds(10));  // 2 s + a heartbeat or two
  }
  ASSERT_TRUE(cluster->KillAndRestartCoordinator().ok());
  cluster->worker(1).Signal(SIGCONT);
  FlatshardClient client(cluster->address());
  const std::string events = Events(client, spec.name());
  std::cerr << events;
  EXPECT_LT(absl::Now() - killed, absl::Seconds(60)) << "waited for the collective timeout";
  EXPECT_THAT(events, HasSubstr("cannot re-adopt epoch 1"));
  EXPECT_THAT(events, HasSubstr("rank 0: epoch 1 seq 6 aborted"));
  EXPECT_THAT(events, HasSubstr("resumed at step 4 from checkpoint step-00000004"));
  // The training operation (to step 12) goes on from the checkpoint.
  ExpectTrainedTo12LikeTheReference(client, spec.name());
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->epoch(), 2u);
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_TRUE(cluster->Stop());
}

// Between a restart and the re-adoption (its workers' heartbeats) the job has
// no epoch to run commands in: every operation is refused as UNAVAILABLE,
// saying why, and the coordinator stays up (it dereferenced a sequencer the
// restore had not made yet); the workers' heartbeats then re-adopt them.
TEST(CoordinatorRestartTest, OperationsBeforeTheReadoptionAreRefusedAsUnavailable) {
  const std::string dir = testing::MakeTempDir("restart-early");
  LocalClusterOptions options = ClusterOptions(dir);
  options.heartbeat_timeout_s = 15;  // the re-adoption waits while the workers are stopped
  auto started = LocalCluster::Start(options);
  ASSERT_TRUE(started.ok()) << started.status();
  std::unique_ptr<LocalCluster> cluster = *std::move(started);
  const v1::JobSpec spec = Job();
  std::map<int64_t, double> losses;
  {
    FlatshardClient client(cluster->address());
    CreateAndWaitReady(client, spec);
    ASSERT_TRUE(TrainSteps(client, spec.name(), 4, &losses).ok());  // saves step-00000004
  }
  for (int w = 0; w < kWorld; ++w) cluster->worker(w).Signal(SIGSTOP);
  ASSERT_TRUE(cluster->KillAndRestartCoordinator().ok());
  FlatshardClient client(cluster->address());
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::RECOVERING);
  const std::map<std::string, absl::Status> refused = {
      {"unshard", client.Unshard(spec.name(), {})},
      {"reshard", client.Reshard(spec.name(), {})},
      {"summon", client.SummonFullParams(spec.name(), false, 0,
                                         [](const v1::TensorChunk&) { return absl::OkStatus(); })},
      {"save",
       [&] {
         v1::SaveCheckpointRequest request;
         request.set_job(spec.name());
         return client.SaveCheckpoint(request, [](const v1::CheckpointProgress&) {}).status();
       }()},
      {"load", client.LoadCheckpoint(spec.name(), "step-00000004").status()},
      {"train", TrainSteps(client, spec.name(), 1, &losses)},
  };
  for (const auto& [what, status] : refused) {
    EXPECT_EQ(status.code(), absl::StatusCode::kUnavailable) << what << ": " << status;
    EXPECT_THAT(std::string(status.message()), HasSubstr("is RECOVERING")) << what;
  }
  ASSERT_TRUE(client.GetJob(spec.name()).ok()) << "the coordinator did not survive";
  for (int w = 0; w < kWorld; ++w) cluster->worker(w).Signal(SIGCONT);
  auto ready = client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(60));
  ASSERT_TRUE(ready.ok()) << ready.status();
  job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->epoch(), 1u);  // re-adopted
  EXPECT_EQ(job->step(), 4);
  ASSERT_TRUE(TrainSteps(client, spec.name(), 2, &losses).ok());
  EXPECT_EQ(losses.at(6), Uninterrupted().losses.at(6));  // bit for bit
  EXPECT_TRUE(cluster->Stop());
}

TEST(CoordinatorRestartTest, ASecondCoordinatorOnTheStateDirIsRefused) {
  const std::string dir = testing::MakeTempDir("restart-lock");
  std::unique_ptr<LocalCluster> cluster = StartCluster(dir);
  ASSERT_NE(cluster, nullptr);
  auto second = ChildProcess::Spawn({std::string(FLATSHARD_BIN_DIR) + "/flatshard-coordinator",
                                     "--listen", "127.0.0.1:0", "--state-dir", dir + "/state"});
  ASSERT_TRUE(second.ok()) << second.status();
  // It never listens (its message, on stderr, is StateStoreTest's) and exits 1.
  EXPECT_EQ((*second)->ReadLine(absl::Seconds(30)).status().code(), absl::StatusCode::kUnavailable);
  const std::optional<int> status = (*second)->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << *status;
  EXPECT_TRUE(cluster->Stop());
}

}  // namespace
}  // namespace flatshard
