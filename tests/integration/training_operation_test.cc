// Training as a server-side operation (issue #11 §4, docs/fault-tolerance.md),
// with real coordinator and worker processes and the real `flatshard` CLI:
// the training outlives the client that started it, clients attach to it and
// stop it, a second one is refused while it runs, and Ctrl-C in the CLI stops
// it after the current step.
#include <algorithm>
#include <csignal>
#include <map>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/integration/mlp_cluster.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

class TrainingOperationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::MlpCluster> started = testing::StartMlpCluster("training-op", 2);
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

  v1::Job Job() {
    auto job = client_->GetJob(job_);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? *job : v1::Job{};
  }

  // The CLI against this cluster; its stdout lines come back through ReadLine.
  std::unique_ptr<ChildProcess> Cli(std::vector<std::string> args) {
    args.insert(args.begin(), {std::string(FLATSHARD_BIN_DIR) + "/flatshard"});
    args.insert(args.end(), {"-c", cluster_->address(), "-j", job_});
    auto cli = ChildProcess::Spawn(args);
    EXPECT_TRUE(cli.ok()) << cli.status();
    return cli.ok() ? *std::move(cli) : nullptr;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<FlatshardClient> client_;
  std::string job_;
};

TEST_F(TrainingOperationTest, DetachedTrainingRunsAttachesAndStops) {
  v1::TrainRequest start;
  start.set_job(job_);
  start.set_steps(100000);
  start.set_detach(true);
  start.set_started_by("alice@laptop");
  int streamed = 0;
  ASSERT_TRUE(client_->Train(start, [&](const v1::StepResult&) { ++streamed; }).ok());
  EXPECT_EQ(streamed, 0);  // detached: nothing streamed, it runs by itself
  v1::Job job = Job();
  EXPECT_EQ(job.state(), v1::TRAINING);
  EXPECT_TRUE(job.training().running());
  EXPECT_EQ(job.training().started_by(), "alice@laptop");
  EXPECT_EQ(job.training().target_step(), 100000);

  // A second training is refused, naming the one that runs.
  v1::TrainRequest second = start;
  second.set_detach(false);
  const absl::Status refused = client_->Train(second, [](const v1::StepResult&) {});
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("already training to step 100000"));
  EXPECT_THAT(refused.message(), HasSubstr("alice@laptop"));

  // Attach: steps from the current one on; after three, another client stops it.
  v1::TrainRequest attach;
  attach.set_job(job_);
  attach.set_attach(true);
  int64_t first = -1, last = -1, seen = 0;
  const absl::Status attached = client_->Train(attach, [&](const v1::StepResult& r) {
    if (first < 0) first = r.step();
    EXPECT_EQ(r.target_step(), 100000);
    if (last >= 0) {
      EXPECT_EQ(r.step(), last + 1);
    }
    last = r.step();
    if (++seen == 3) {
      FlatshardClient other(cluster_->address());
      auto stopped = other.StopTraining(job_);
      EXPECT_TRUE(stopped.ok()) << stopped.status();
    }
  });
  EXPECT_TRUE(attached.ok()) << attached;
  EXPECT_GE(first, 1);
  EXPECT_GE(seen, 3);
  job = Job();
  EXPECT_EQ(job.state(), v1::IDLE);
  EXPECT_FALSE(job.training().running());
  EXPECT_EQ(job.step(), last);  // it stopped after the step in flight, and streamed it
  EXPECT_EQ(job.training().outcome(), absl::StrCat("stopped on request at step ", last));
  // Nothing runs now: attach and stop are refused.
  EXPECT_EQ(client_->Train(attach, [](const v1::StepResult&) {}).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client_->StopTraining(job_).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(TrainingOperationTest, TrainingOutlivesAKilledClient) {
  std::unique_ptr<ChildProcess> cli = Cli({"train", "--steps", "40"});
  ASSERT_NE(cli, nullptr);
  auto line = cli->ReadLine(absl::Seconds(60));  // the first step
  ASSERT_TRUE(line.ok()) << line.status();
  EXPECT_THAT(*line, HasSubstr("step 1 "));
  cli->Signal(SIGKILL);
  (void)cli->Wait(absl::Seconds(10));
  // The coordinator goes on to step 40 without it.
  ASSERT_TRUE(client_->WaitForState(job_, {v1::IDLE}, absl::Seconds(120)).ok());
  const v1::Job job = Job();
  EXPECT_EQ(job.step(), 40);
  EXPECT_EQ(job.training().outcome(), "trained to step 40");
}

TEST_F(TrainingOperationTest, CtrlCStopsAfterTheCurrentStep) {
  std::unique_ptr<ChildProcess> cli = Cli({"train", "--steps", "100000"});
  ASSERT_NE(cli, nullptr);
  auto line = cli->ReadLine(absl::Seconds(60));
  ASSERT_TRUE(line.ok()) << line.status();
  cli->Signal(SIGINT);
  std::string all;
  while (true) {
    auto next = cli->ReadLine(absl::Seconds(60));
    if (!next.ok()) break;  // stdout closed: it exited
    all += *next + "\n";
  }
  const std::optional<int> status = cli->Wait(absl::Seconds(30));
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << *status << "\n" << all;
  EXPECT_THAT(all, HasSubstr("stopped on request at step"));
  const v1::Job job = Job();
  EXPECT_EQ(job.state(), v1::IDLE);
  EXPECT_LT(job.step(), 100000);
  EXPECT_THAT(job.training().outcome(), HasSubstr("stopped on request"));
}

// Workers report going idle when training ends, not a heartbeat interval
// later: with 10 s between heartbeats, `flatshard workers` right after a
// training showed every rank still "running".
TEST(WorkerStateTest, RanksReportReadyAsSoonAsTrainingEnds) {
  const std::string dir = testing::MakeTempDir("worker-state");
  LocalClusterOptions options;
  options.workers = 2;
  options.bin_dir = FLATSHARD_BIN_DIR;
  options.checkpoint_dir = dir + "/checkpoints";
  options.heartbeat_interval_s = 10;
  options.heartbeat_timeout_s = 60;
  auto cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  FlatshardClient client((*cluster)->address());
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  spec->set_world_size(2);
  ASSERT_TRUE(client.CreateJob(*spec).ok());
  ASSERT_TRUE(client.WaitForState(spec->name(), {v1::READY}, absl::Seconds(120)).ok());
  ASSERT_TRUE(client.Train(spec->name(), 5, 0, [](const v1::StepResult&) {}).ok());
  const absl::Time ended = absl::Now();
  // Polled against a deadline a tenth of the heartbeat interval.
  bool all_ready = false;
  while (!all_ready && absl::Now() - ended < absl::Seconds(1)) {
    auto workers = client.ListWorkers(spec->name());
    ASSERT_TRUE(workers.ok()) << workers.status();
    all_ready = std::all_of(workers->begin(), workers->end(),
                            [](const v1::WorkerInfo& w) { return w.state() == "ready"; });
    if (!all_ready) absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_TRUE(all_ready) << "a rank still reports running 1 s after training ended";
  EXPECT_TRUE((*cluster)->Stop());
}

}  // namespace
}  // namespace flatshard
