// The clock guards of a job's checkpoint history (coordinator/checkpoint_history.h):
// a coordinator in this process, whose checkpoint clock the test steps, and
// two real worker daemons writing real checkpoints. A wall clock that steps
// back or stands still must neither drop a save from the history it belongs
// to nor let a save of the history a load left into the new one. The
// checkpoint a recovery would restore (CheckpointInfo.recovery_target) shows
// which history the coordinator holds. A gate in the way of async saves'
// commits (the coordinator's clients to the workers wrap it) holds one
// while a load comes.
#include <filesystem>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "client/child_process.h"
#include "client/flatshard_client.h"
#include "coordinator/checkpoint_catalog.h"
#include "coordinator/forwarding_worker_client.h"
#include "coordinator/grpc_worker_client.h"
#include "storage/checkpoint_convert.h"
#include "storage/spec_files.h"
#include "tests/integration/gate.h"
#include "tests/integration/in_process_coordinator.h"
#include "tests/integration/multiprocess.h"

namespace flatshard {
namespace {

constexpr int kWorkers = 2;

// absl::Now, moved by an offset, or held at one time.
class SteppedClock {
 public:
  absl::Time Now() const {
    std::lock_guard<std::mutex> lock(mu_);
    return held_.value_or(absl::Now() + offset_);
  }
  void Step(absl::Duration by) {
    std::lock_guard<std::mutex> lock(mu_);
    offset_ += by;
  }
  void Hold(absl::Time at) {
    std::lock_guard<std::mutex> lock(mu_);
    held_ = at;
  }

 private:
  mutable std::mutex mu_;
  absl::Duration offset_;
  std::optional<absl::Time> held_;
};

// A worker's client whose waits for async saves (the coordinator's commit
// of one) pass a gate first.
class GatedSaveClient final : public ForwardingWorkerClient {
 public:
  GatedSaveClient(std::unique_ptr<WorkerClient> inner, testing::Gate* gate)
      : ForwardingWorkerClient(std::move(inner)), gate_(gate) {}
  // Passed on the thread that starts the call (the commit's, for each
  // rank's first call).
  void AwaitSave(const std::string& directory, absl::Time deadline, AwaitSaveDone done) override {
    gate_->Pass();
    ForwardingWorkerClient::AwaitSave(directory, deadline, std::move(done));
  }

 private:
  testing::Gate* gate_;
};

class CheckpointClockTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string dir = testing::MakeTempDir("checkpoint-clock");
    checkpoints_ = dir + "/checkpoints";
    const std::string& checkpoints = checkpoints_;
    CoordinatorOptions options;
    options.job.checkpoint_root = checkpoints;
    options.job.checkpoint_clock = [this] { return clock_.Now(); };
    options.job.connect = [this](const WorkerRecord& w,
                                 size_t world_size) -> std::unique_ptr<WorkerClient> {
      return std::make_unique<GatedSaveClient>(
          std::make_unique<GrpcWorkerClient>(w.address, nullptr, w.command_token,
                                             WorkerChannelIdle(world_size)),
          &commit_gate_);
    };
    auto coordinator = testing::InProcessCoordinator::Start(options);
    ASSERT_TRUE(coordinator.ok()) << coordinator.status();
    coordinator_ = *std::move(coordinator);
    for (int i = 0; i < kWorkers; ++i) {
      auto worker =
          ChildProcess::Spawn({std::string(FLATSHARD_BIN_DIR) + "/flatshard-worker",
                               "--coordinator", coordinator_->address(), "--rank", absl::StrCat(i),
                               "--state-dir", absl::StrCat(dir, "/worker-", i), "--checkpoint-dir",
                               checkpoints, "--metrics-listen", "", "--compute-threads", "1"});
      ASSERT_TRUE(worker.ok()) << worker.status();
      // Its banner: registered and serving.
      auto banner = (*worker)->ReadLine(absl::Seconds(60));
      ASSERT_TRUE(banner.ok()) << banner.status();
      workers_.push_back(*std::move(worker));
    }
    client_ = std::make_unique<FlatshardClient>(coordinator_->address());
    auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec->set_world_size(kWorkers);
    spec->mutable_checkpoints()->set_keep_last(0);  // every save stays listed
    spec_ = *spec;
    job_ = spec_.name();
    CreateJob(spec_);
  }

  void CreateJob(const v1::JobSpec& spec) {
    ASSERT_TRUE(client_->CreateJob(spec).ok());
    auto ready = client_->WaitForState(job_, {v1::READY}, absl::Seconds(120));
    ASSERT_TRUE(ready.ok()) << ready.status();
  }
  // Deleted, then created again (its checkpoints stay).
  void RecreateJob(const v1::JobSpec& spec) {
    ASSERT_TRUE(client_->DeleteJob(job_).ok());
    CreateJob(spec);
  }

  void TearDown() override {
    coordinator_.reset();  // the job's end first: the workers' calls into it return
    workers_.clear();      // each is terminated (SIGTERM) and waited for
  }

  void Train(int64_t steps) {
    ASSERT_TRUE(client_->Train(job_, steps, 0, [](const v1::StepResult&) {}).ok());
  }
  void TrainAndSave(const std::string& name) {
    Train(1);
    v1::SaveCheckpointRequest request;
    request.set_job(job_);
    request.set_name(name);
    auto saved = client_->SaveCheckpoint(request);
    ASSERT_TRUE(saved.ok()) << saved.status();
  }
  void Load(const std::string& name) {
    auto loaded = client_->LoadCheckpoint(job_, name);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
  }
  // What `flatshard ARGS...` prints on stdout.
  static std::string Cli(std::vector<std::string> args) {
    args.insert(args.begin(), std::string(FLATSHARD_BIN_DIR) + "/flatshard");
    auto cli = ChildProcess::Spawn(args);
    EXPECT_TRUE(cli.ok()) << cli.status();
    std::string said;
    if (!cli.ok()) return said;
    for (auto line = (*cli)->ReadLine(absl::Seconds(60)); line.ok();
         line = (*cli)->ReadLine(absl::Seconds(60))) {
      said += *line + "\n";
    }
    return said;
  }
  // What a recovery would restore now.
  std::string RecoveryTarget() {
    auto listed = client_->ListCheckpoints(job_);
    EXPECT_TRUE(listed.ok()) << listed.status();
    std::string target;
    if (!listed.ok()) return target;
    for (const v1::CheckpointInfo& c : *listed) {
      if (c.recovery_target()) target = c.name();
    }
    return target;
  }
  int64_t CreatedMicros(const std::string& name) {
    auto listed = client_->ListCheckpoints(job_);
    EXPECT_TRUE(listed.ok()) << listed.status();
    if (!listed.ok()) return -1;
    for (const v1::CheckpointInfo& c : *listed) {
      if (c.name() == name) return c.created_unix_micros();
    }
    ADD_FAILURE() << "no checkpoint '" << name << "' listed";
    return -1;
  }

  SteppedClock clock_;
  testing::Gate commit_gate_;  // in the way of async saves' commits
  std::string checkpoints_;    // the workers' --checkpoint-dir, the coordinator's root
  std::unique_ptr<testing::InProcessCoordinator> coordinator_;
  std::vector<std::unique_ptr<ChildProcess>> workers_;
  std::unique_ptr<FlatshardClient> client_;
  v1::JobSpec spec_;
  std::string job_;
};

// A load when the clock has stepped back behind the newer save: that save
// is of the history the load left, not of the one it starts.
TEST_F(CheckpointClockTest, ALoadAfterTheClockSteppedBackStartsItsHistoryAfterEverySave) {
  TrainAndSave("a");
  TrainAndSave("b");
  clock_.Step(-absl::Hours(1));
  Load("a");
  EXPECT_EQ(RecoveryTarget(), "a");
  // And a save now, the clock still behind, is of the new history.
  TrainAndSave("c");
  EXPECT_EQ(RecoveryTarget(), "c");
  EXPECT_GT(CreatedMicros("c"), CreatedMicros("b"));
}

// A save when the clock has stepped back behind the load that started its
// history: it is still stamped inside that history.
TEST_F(CheckpointClockTest, ASaveAfterTheClockSteppedBackStaysInItsHistory) {
  TrainAndSave("a");
  TrainAndSave("b");
  clock_.Step(absl::Hours(1));
  Load("a");
  clock_.Step(-absl::Hours(1));
  TrainAndSave("c");
  EXPECT_EQ(RecoveryTarget(), "c");
}

// Saves while the clock stands still are ordered as they were taken (the
// catalog orders by creation time, then by name): "y" after "z" is the
// newer, whatever the names say.
TEST_F(CheckpointClockTest, SavesWhileTheClockStandsStillAreOrderedAsTaken) {
  clock_.Hold(absl::Now() + absl::Hours(1));
  TrainAndSave("z");
  TrainAndSave("y");
  EXPECT_EQ(RecoveryTarget(), "y");
  EXPECT_EQ(CreatedMicros("y"), CreatedMicros("z") + 1);
}

// A load while an async save is still being written: that save is of the
// history the load leaves, so its commit comes first and the load's history
// starts after it, even with the clock standing still (the save's stamp then
// one past the loaded checkpoint's, where the history would otherwise start).
TEST_F(CheckpointClockTest, ALoadWaitsForTheAsyncSaveBeforeIt) {
  clock_.Hold(absl::Now() + absl::Hours(1));
  TrainAndSave("a");
  Train(1);
  commit_gate_.Arm();
  v1::SaveCheckpointRequest request;
  request.set_job(job_);
  request.set_name("b");
  request.set_async_save(true);
  auto saved = std::async(std::launch::async,
                          [this, request] { return client_->SaveCheckpoint(request).status(); });
  auto loaded = std::async(std::launch::async, [this] {
    // Once "b" is snapshotted and its commit waits on the gate.
    if (!commit_gate_.WaitEntered(std::chrono::seconds(120))) {
      return absl::DeadlineExceededError("the async save's commit never began");
    }
    return client_->LoadCheckpoint(job_, "a").status();
  });
  absl::Cleanup let_go = [this] { commit_gate_.Release(); };
  // The load holds the job's operation slot while the commit waits: another
  // operation (a summon, harmless if it comes first) is refused as busy with
  // it. A load that did not wait would be over, and the summon would run.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  absl::Status probe;
  do {
    probe = client_->SummonFullParams(job_, false, 1 << 20,
                                      [](const v1::TensorChunk&) { return absl::OkStatus(); });
  } while (!absl::StrContains(probe.message(), "load a checkpoint") && absl::Now() < deadline);
  EXPECT_EQ(probe.code(), absl::StatusCode::kFailedPrecondition) << probe;
  EXPECT_TRUE(absl::StrContains(probe.message(), "load a checkpoint")) << probe;
  commit_gate_.Release();
  ASSERT_TRUE(saved.get().ok());
  ASSERT_TRUE(loaded.get().ok());
  // (Stamped when snapshotted, whenever it commits: the clock held still.)
  EXPECT_EQ(CreatedMicros("b"), CreatedMicros("a") + 1);
  EXPECT_EQ(RecoveryTarget(), "a");
}

// A job deleted and created again over its old checkpoints: they are the
// earlier job's, not its history, until it loads one; a recovery before its
// own first save begins again at the initialization.
TEST_F(CheckpointClockTest, AJobCreatedAgainHasOnlyItsOwnSavesAsItsHistory) {
  TrainAndSave("a");
  // Behind "a": the history begins after every listed save, not at the clock.
  clock_.Step(-absl::Hours(1));
  RecreateJob(spec_);
  EXPECT_EQ(RecoveryTarget(), "");
  TrainAndSave("b");
  EXPECT_EQ(RecoveryTarget(), "b");
  // A load makes one of the earlier job's its history.
  Load("a");
  EXPECT_EQ(RecoveryTarget(), "a");
}

// A checkpoint converted into the job's directory holds its source's state,
// saved when the source was: a copy of a checkpoint of the history a load
// left is not a save of the new history, however recently it was written.
// And it is the user's: not scheduled, whatever its source was.
TEST_F(CheckpointClockTest, ACopyConvertedIntoTheJobsDirectoryIsOfItsSourcesHistory) {
  v1::JobSpec every_step = spec_;
  every_step.mutable_checkpoints()->set_every_steps(1);
  RecreateJob(every_step);
  Train(2);
  Load("step-00000001");
  const std::string job_dir = checkpoints_ + "/" + job_;
  absl::StatusOr<CheckpointManifest> source =
      CheckpointCatalog(checkpoints_, job_).Read("step-00000002");
  ASSERT_TRUE(source.ok()) << source.status();
  ASSERT_TRUE(source->scheduled);
  absl::StatusOr<CheckpointManifest> copy =
      ReshardCheckpoint(job_dir + "/step-00000002", job_dir + "/resharded-2", 1);
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_FALSE(copy->scheduled);
  EXPECT_EQ(copy->converted_from, "step-00000002");
  EXPECT_EQ(CreatedMicros("resharded-2"), CreatedMicros("step-00000002"));
  EXPECT_EQ(RecoveryTarget(), "step-00000001");
}

// A copy of the checkpoint a recovery would restore, whose name sorts after
// it: the same state at the same time, and the source stays the target (the
// checkpoint the ranks' state is named by, which a stop need not save again).
TEST_F(CheckpointClockTest, ACopyOfTheRecoveryTargetDoesNotTakeItsPlace) {
  TrainAndSave("a");
  const std::string job_dir = checkpoints_ + "/" + job_;
  absl::StatusOr<CheckpointManifest> copy =
      ConsolidateCheckpoint(job_dir + "/a/", job_dir + "/z-full");
  ASSERT_TRUE(copy.ok()) << copy.status();
  EXPECT_EQ(copy->converted_from, "a");
  EXPECT_EQ(CreatedMicros("z-full"), CreatedMicros("a"));
  EXPECT_EQ(RecoveryTarget(), "a");
  auto job = client_->GetJob(job_);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state_checkpoint(), "a");
  // The listing, `flatshard ckpt ls` and `ckpt inspect` say what it is.
  auto listed = client_->ListCheckpoints(job_);
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const v1::CheckpointInfo& c : *listed) {
    EXPECT_EQ(c.converted_from(), c.name() == "z-full" ? "a" : "") << c.name();
  }
  EXPECT_THAT(Cli({"ckpt", "ls", "-c", coordinator_->address(), "-j", job_}),
              ::testing::HasSubstr("z-full (a copy of a)"));
  EXPECT_THAT(Cli({"ckpt", "inspect", job_dir + "/z-full"}),
              ::testing::HasSubstr("a copy of checkpoint a (its state and its time"));
  // A copy names its source by the directory it was read from, the name it
  // is listed and loaded by, not the one its manifest was saved under.
  const std::string elsewhere = checkpoints_ + "/elsewhere";
  std::filesystem::create_directories(elsewhere);
  std::filesystem::copy(job_dir + "/a", elsewhere + "/best",
                        std::filesystem::copy_options::recursive);
  absl::StatusOr<CheckpointManifest> renamed =
      ReshardCheckpoint(elsewhere + "/best", elsewhere + "/best-w1", 1);
  ASSERT_TRUE(renamed.ok()) << renamed.status();
  EXPECT_EQ(renamed->converted_from, "best");
}

}  // namespace
}  // namespace flatshard
