// A worker SIGKILLed in the middle of training (issue #4): the step fails
// within the heartbeat timeout with a message naming the rank, the surviving
// workers' collectives are aborted (they answer, idle, instead of hanging in
// Gloo until its timeout), and the coordinator keeps serving. And a killed
// daemon started again at once, by its supervisor, takes its seat back,
// unless it cannot be configured (its node lost the data set) or cannot be
// reached: then the job shrinks without seating it again.
#include <csignal>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "coordinator/grpc_worker_client.h"
#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/recovery_harness.h"
#include "tests/integration/regression_data_set.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr double kHeartbeatTimeout = 2.0;

std::unique_ptr<LocalCluster> StartCluster() {
  LocalClusterOptions options;
  options.workers = 4;
  options.bin_dir = FLATSHARD_BIN_DIR;
  options.heartbeat_interval_s = 0.25;
  options.heartbeat_timeout_s = kHeartbeatTimeout;
  options.collective_timeout_s = 120;  // what the survivors would hang for without abort
  options.checkpoint_dir = testing::MakeTempDir("worker-failure");
  auto cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

// Trains until 3 steps are in, then sends `signal` to rank 2's daemon; the
// Train status and how long after the signal it ended.
std::pair<absl::Status, absl::Duration> TrainAndSignalRank2(LocalCluster& cluster,
                                                            FlatshardClient& client,
                                                            const std::string& job, int signal) {
  absl::Notification training;
  int64_t steps_seen = 0;
  absl::Status trained;
  std::thread train([&] {
    trained = client.Train(job, 100000, 0, [&](const v1::StepResult&) {
      if (++steps_seen == 3) training.Notify();
    });
  });
  training.WaitForNotification();
  const absl::Time signalled = absl::Now();
  cluster.worker(2).Signal(signal);
  train.join();
  const absl::Duration took = absl::Now() - signalled;
  std::cerr << "Train ended " << took << " after signal " << signal << ": " << trained << "\n";
  return {trained, took};
}

v1::JobSpec ReadyJob(FlatshardClient& client) {
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  // Detection and abort alone: recovery_test covers what recovery does next.
  spec->mutable_recovery()->set_max_restarts(0);
  EXPECT_TRUE(client.CreateJob(*spec).ok());
  EXPECT_TRUE(client.WaitForState(spec->name(), {v1::READY}, absl::Seconds(120)).ok());
  return *spec;
}

TEST(WorkerFailureTest, SigkillMidStepFailsTheStepNamingTheRankAndSurvivorsAbort) {
  std::unique_ptr<LocalCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = ReadyJob(client);
  auto [trained, took] = TrainAndSignalRank2(*cluster, client, spec.name(), SIGKILL);
  EXPECT_FALSE(trained.ok());
  EXPECT_THAT(std::string(trained.message()), HasSubstr("rank 2"));
  EXPECT_LT(took, absl::Seconds(kHeartbeatTimeout)) << trained;

  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status() << " (the coordinator keeps serving)";
  EXPECT_EQ(job->state(), v1::FAILED);
  EXPECT_THAT(job->failure(), HasSubstr("rank 2"));

  // Train returned only after every rank's batch did: the survivors are out
  // of their collectives, answer at once and refuse further batches.
  for (int rank : {0, 1, 3}) {
    GrpcWorkerClient worker(cluster->worker_addresses()[static_cast<size_t>(rank)], nullptr,
                            cluster->command_token());
    auto status = worker.GetStatus(absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(status.ok()) << "rank " << rank << ": " << status.status();
    EXPECT_THAT(status->state(), ::testing::AnyOf("aborted", "failed")) << "rank " << rank;
  }
  auto refused = client.Train(spec.name(), 1, 0, [](const v1::StepResult&) {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("FAILED"));
  ASSERT_TRUE(client.DeleteJob(spec.name()).ok());
}

// The same failure as `flatshard train` sees it: the job FAILED, exit 1. Its
// failure is UNAVAILABLE (a rank that no longer answers), which the CLI took
// for its stream being cut: it said the training went on, to attach again.
TEST(WorkerFailureTest, TheCliReportsAJobThatFailedUnderItAsFailed) {
  std::unique_ptr<LocalCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = ReadyJob(client);
  auto cli = ChildProcess::Spawn({"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1",
                                  std::string(FLATSHARD_BIN_DIR) + "/flatshard", "train", "--steps",
                                  "100000", "-c", cluster->address(), "-j", spec.name()});
  ASSERT_TRUE(cli.ok()) << cli.status();
  std::string said;
  absl::StatusOr<std::string> line;
  while ((line = (*cli)->ReadLine(absl::Seconds(60))).ok()) {
    said += *line + "\n";
    if (absl::StrContains(*line, "step 3 ")) break;
  }
  ASSERT_THAT(said, HasSubstr("step 3 "));
  cluster->worker(2).Signal(SIGKILL);
  while ((line = (*cli)->ReadLine(absl::Seconds(60))).ok()) said += *line + "\n";
  const std::optional<int> status = (*cli)->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << *status << "\n" << said;
  EXPECT_THAT(said, HasSubstr("rank 2"));
  EXPECT_THAT(said, Not(HasSubstr("was cut")));
}

// A worker that hangs (SIGSTOP: its sockets stay open, so only the missing
// heartbeats tell): the coordinator fails the step once the heartbeat timeout
// passes, cancels the hung call, and aborts the survivors' collectives.
TEST(WorkerFailureTest, HungWorkerFailsTheStepAtTheHeartbeatTimeout) {
  std::unique_ptr<LocalCluster> cluster = StartCluster();
  ASSERT_NE(cluster, nullptr);
  FlatshardClient client(cluster->address());
  const v1::JobSpec spec = ReadyJob(client);
  auto [trained, took] = TrainAndSignalRank2(*cluster, client, spec.name(), SIGSTOP);
  EXPECT_FALSE(trained.ok());
  EXPECT_THAT(std::string(trained.message()), HasSubstr("rank 2"));
  EXPECT_THAT(std::string(trained.message()), HasSubstr("missed heartbeats"));
  // Detection needs the timeout to pass (less the beat in flight when it hung);
  // then one monitor tick and the aborts.
  EXPECT_GT(took, absl::Seconds(kHeartbeatTimeout / 2));
  EXPECT_LT(took, absl::Seconds(kHeartbeatTimeout + 1.5)) << trained;
  for (int rank : {0, 1, 3}) {
    GrpcWorkerClient worker(cluster->worker_addresses()[static_cast<size_t>(rank)], nullptr,
                            cluster->command_token());
    auto status = worker.GetStatus(absl::Now() + absl::Seconds(5));
    ASSERT_TRUE(status.ok()) << "rank " << rank << ": " << status.status();
    EXPECT_EQ(status->state(), "aborted") << "rank " << rank;
  }
  cluster->worker(2).Signal(SIGCONT);
}

// Two workers whose ids' secrets are under <dir>/state, for daemons started
// again under their ids. A killed daemon's registration stays live
// throughout (the heartbeat timeout is a minute), so a job learns of the
// restart from the takeover (another daemon process), not from a timeout.
LocalClusterOptions RestartableWorkers(const std::string& dir) {
  LocalClusterOptions options;
  options.workers = 2;
  options.bin_dir = FLATSHARD_BIN_DIR;
  options.heartbeat_interval_s = 0.25;
  options.heartbeat_timeout_s = 60;
  options.checkpoint_dir = dir + "/checkpoints";
  options.state_dir = dir + "/state";
  return options;
}

// The demo job on both workers; without a spare, a recovery that cannot seat
// two shrinks after `spare_wait_s`.
v1::JobSpec TwoRankJob(double spare_wait_s) {
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->set_world_size(2);
  spec->mutable_recovery()->set_spare_wait_s(spare_wait_s);
  return *spec;
}

// SIGKILLs worker 1 and waits until it is gone.
void KillWorker1(LocalCluster& cluster) {
  cluster.worker(1).Signal(SIGKILL);
  ASSERT_TRUE(cluster.worker(1).Wait(absl::Seconds(30)).has_value());
}

// What a supervisor (flatshard up, Slurm's loop, systemd) does after a crash:
// start the daemon again at once, under its --worker-id. Its old
// registration is still live, and the new daemon proves it is the same
// worker with the secret its seat in --state-dir keeps, so it is registered
// at once, at its new address, with its rank. Before, it was refused until
// the old registration had missed a timeout's worth of heartbeats. The job
// recovers at once, not at the heartbeat timeout. Someone else who knows the
// id is still refused, and a second daemon on the same seat never reaches
// the coordinator.
TEST(WorkerFailureTest, ADaemonStartedAgainAtOnceProvesItIsTheSameWorker) {
  const std::string dir = testing::MakeTempDir("worker-restart");
  const LocalClusterOptions options = RestartableWorkers(dir);
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  FlatshardClient client((*cluster)->address());
  const v1::JobSpec spec = TwoRankJob(/*spare_wait_s=*/0.5);
  testing::CreateAndWaitReady(client, spec);
  const std::string old_address = (*cluster)->worker_addresses()[1];
  KillWorker1(**cluster);
  ASSERT_TRUE((*cluster)->RestartWorker(1).ok());
  const std::string new_address = (*cluster)->worker_addresses()[1];
  absl::StatusOr<v1::JobState> recovered =
      client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(30), {v1::RECOVERING});
  ASSERT_TRUE(recovered.ok()) << recovered.status() << " (the restart went unnoticed)";
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_THAT(job->last_recovery().cause(),
              HasSubstr("worker worker-1 restarted: a new daemon registered at " + new_address +
                        " in place of the one at " + old_address));
  const auto registered_at = [&]() -> std::string {
    auto workers = client.ListWorkers();
    EXPECT_TRUE(workers.ok()) << workers.status();
    for (const v1::WorkerInfo& w : workers.ok() ? *workers : std::vector<v1::WorkerInfo>{}) {
      if (w.worker_id() == "worker-1") return w.address();
    }
    return "";
  };
  EXPECT_EQ(registered_at(), new_address);
  EXPECT_THAT((*cluster)->worker_banners()[1], HasSubstr("worker-1 rank 1 "));

  // A daemon's output, stderr included, and its exit status.
  const auto run_worker = [&](const std::string& state_dir) {
    auto daemon = ChildProcess::Spawn(
        {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1",
         std::string(FLATSHARD_BIN_DIR) + "/flatshard-worker", "--coordinator",
         (*cluster)->address(), "--worker-id", "worker-1", "--state-dir", state_dir, "--listen",
         "127.0.0.1:0", "--metrics-listen", "", "--command-token-file",
         options.state_dir + "/command.token", "--connect-timeout", "10"});
    EXPECT_TRUE(daemon.ok()) << daemon.status();
    std::string said;
    if (!daemon.ok()) return std::pair{said, -1};
    absl::StatusOr<std::string> line;
    while ((line = (*daemon)->ReadLine(absl::Seconds(30))).ok()) said += *line + "\n";
    const std::optional<int> status = (*daemon)->Wait(absl::Seconds(30));
    return std::pair{said, status.has_value() && WIFEXITED(*status) ? WEXITSTATUS(*status) : -1};
  };
  // The live daemon holds the seat: a second one on it stops before registering.
  auto [twice, twice_status] = run_worker(options.state_dir + "/worker-seats");
  EXPECT_EQ(twice_status, 1) << twice;
  EXPECT_THAT(twice, HasSubstr("another flatshard-worker runs as worker id 'worker-1'"));
  // Another state dir has another secret: the coordinator refuses it.
  auto [foreign, foreign_status] = run_worker(dir + "/elsewhere");
  EXPECT_EQ(foreign_status, 1) << foreign;
  EXPECT_THAT(foreign, HasSubstr("belongs to a live worker at " + new_address));
  EXPECT_EQ(registered_at(), new_address);
  EXPECT_TRUE((*cluster)->Stop());
}

// Started again under its id on a node that lost its data set, a daemon
// answers the recovery's probe and is seated, but cannot be configured. The
// recovery refuses it as it would a spare: its next try shrinks the job onto
// the survivor instead of seating it again, and again, until the restarts
// run out.
TEST(WorkerFailureTest, ADaemonStartedAgainWithoutItsDataIsRefusedAndTheJobShrinks) {
  const std::string dir = testing::MakeTempDir("worker-restart-no-data");
  testing::WriteRegressionDataSet(dir + "/data");
  std::filesystem::create_directories(dir + "/lost");
  LocalClusterOptions options = RestartableWorkers(dir);
  options.data_dir = dir + "/data";
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  FlatshardClient client((*cluster)->address());
  v1::JobSpec spec = TwoRankJob(/*spare_wait_s=*/1);
  spec.mutable_data()->set_kind(v1::DataSpec::FILE);
  spec.mutable_data()->set_path("set");
  testing::CreateAndWaitReady(client, spec);
  KillWorker1(**cluster);
  ASSERT_TRUE((*cluster)->RestartWorker(1, {{"--data-dir", dir + "/lost"}}).ok());
  const std::string new_address = (*cluster)->worker_addresses()[1];

  auto recovered =
      client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(60), {v1::RECOVERING});
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  // The first try seated it, readmitted, and failed; the second shrank.
  EXPECT_EQ(job->restarts(), 2);
  EXPECT_EQ(job->world_size(), 1);
  const v1::Recovery& r = job->last_recovery();
  EXPECT_THAT(r.cause(), HasSubstr("(worker worker-1 at " + new_address));
  EXPECT_THAT(r.cause(), HasSubstr("could not be configured"));
  EXPECT_FALSE(r.spare_used());
  absl::Status trained = client.Train(spec.name(), 2, 0, [](const v1::StepResult&) {});
  ASSERT_TRUE(trained.ok()) << trained;
  job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->step(), 2);
  EXPECT_EQ(job->world_size(), 1);
  EXPECT_TRUE((*cluster)->Stop());
}

// Started again under its id at an address the coordinator cannot reach (a
// wrong --advertise-host, a one-way partition), a daemon heartbeats but never
// answers its probe. The recovery asks it again after its heartbeats while
// it waits for seats, never seats it, and at the end of the wait shrinks the
// job onto the survivor, one recovery spent.
TEST(WorkerFailureTest, ADaemonStartedAgainThatCannotBeReachedIsLeftOutAndTheJobShrinks) {
  const std::string dir = testing::MakeTempDir("worker-restart-unreachable");
  auto cluster = LocalCluster::Start(RestartableWorkers(dir));
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  FlatshardClient client((*cluster)->address());
  constexpr double kSpareWaitS = 2;
  const v1::JobSpec spec = TwoRankJob(kSpareWaitS);
  testing::CreateAndWaitReady(client, spec);
  KillWorker1(**cluster);
  // It listens on 127.0.0.1 only: nothing answers at 127.0.0.2.
  ASSERT_TRUE((*cluster)->RestartWorker(1, {{"--advertise-host", "127.0.0.2"}}).ok());
  const std::string unreachable = (*cluster)->worker_addresses()[1];
  ASSERT_THAT(unreachable, ::testing::StartsWith("127.0.0.2:"));

  auto recovered =
      client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(60), {v1::RECOVERING});
  ASSERT_TRUE(recovered.ok()) << recovered.status();
  auto job = client.GetJob(spec.name());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->restarts(), 1);
  EXPECT_EQ(job->world_size(), 1);
  const v1::Recovery& r = job->last_recovery();
  EXPECT_THAT(r.cause(), HasSubstr("worker worker-1 restarted"));
  EXPECT_THAT(r.failed_ranks(), ::testing::ElementsAre(1));
  EXPECT_FALSE(r.spare_used());
  // The wait, its last probe (2 s at most) and the re-formation, not more.
  EXPECT_LT(r.seconds(), kSpareWaitS + 10) << r.ShortDebugString();
  auto workers = client.ListWorkers();
  ASSERT_TRUE(workers.ok()) << workers.status();
  bool listed = false;
  for (const v1::WorkerInfo& w : *workers) {
    if (w.worker_id() != "worker-1") continue;
    listed = true;
    EXPECT_EQ(w.address(), unreachable);
    EXPECT_LT(w.rank(), 0) << "seated although it never answered";
  }
  EXPECT_TRUE(listed) << "its heartbeats keep it registered";
  EXPECT_TRUE((*cluster)->Stop());
}

}  // namespace
}  // namespace flatshard
