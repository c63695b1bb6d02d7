// What `flatshard up` saves before it stops (client/save_before_stop.h),
// against a real coordinator and workers: which jobs' state is not the
// checkpoint a restart would restore, and the names their saves take.
#include "client/save_before_stop.h"

#include <csignal>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/time/civil_time.h"
#include "absl/time/time.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "coordinator/state_store.h"
#include "tests/integration/mlp_cluster.h"

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr char kJob[] = "mlp-demo";

class SaveBeforeStopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    state_dir_ = testing::MakeTempDir("save-before-stop-state");
    absl::StatusOr<testing::MlpCluster> started = testing::StartMlpCluster(
        "save-before-stop", 2,
        [&](LocalClusterOptions& options, v1::JobSpec&) { options.state_dir = state_dir_; });
    ASSERT_TRUE(started.ok()) << started.status();
    ASSERT_EQ(started->spec.name(), kJob);
    cluster_ = std::move(started->cluster);
    client_ = std::move(started->client);
  }

  void Train(int64_t steps) {
    ASSERT_TRUE(client_->Train(kJob, steps, 0, [](const v1::StepResult&) {}).ok());
  }
  void Save(const std::string& name) {
    v1::SaveCheckpointRequest request;
    request.set_job(kJob);
    request.set_name(name);
    auto saved = client_->SaveCheckpoint(request);
    ASSERT_TRUE(saved.ok()) << saved.status();
  }
  void Load(const std::string& name) {
    auto loaded = client_->LoadCheckpoint(kJob, name);
    ASSERT_TRUE(loaded.ok()) << loaded.status();
  }
  std::string StateCheckpoint() {
    auto job = client_->GetJob(kJob);
    EXPECT_TRUE(job.ok()) << job.status();
    return job.ok() ? job->state_checkpoint() : "(unknown)";
  }
  std::vector<UnsavedJob> Unsaved() {
    auto unsaved = FindUnsavedJobs(*client_);
    EXPECT_TRUE(unsaved.ok()) << unsaved.status();
    return unsaved.ok() ? *unsaved : std::vector<UnsavedJob>{};
  }

  // The job's state checkpoint as the coordinator's state store holds it
  // (the coordinator must be down: the store is locked while it runs).
  std::string StoredStateCheckpoint() {
    auto store = StateStore::Open(state_dir_);
    EXPECT_TRUE(store.ok()) << store.status();
    if (!store.ok()) return "(no store)";
    auto jobs = (*store)->LoadJobs();
    EXPECT_TRUE(jobs.ok() && jobs->size() == 1) << jobs.status();
    return jobs.ok() && jobs->size() == 1 ? (*jobs)[0].state_checkpoint : "(no job)";
  }

  std::string state_dir_;
  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<FlatshardClient> client_;
};

// Unsaved at `step`; a restart would restore `restored` ("": the job's
// initialization) at `restored_step`.
MATCHER_P4(IsUnsaved, name, step, restored, restored_step, "") {
  return arg.name == name && arg.step == step && arg.restored_name == restored &&
         arg.restored_step == restored_step;
}

TEST_F(SaveBeforeStopTest, AJobIsUnsavedOnceItTrainsPastItsCheckpoint) {
  // At its initialization: a restart makes it again from its spec.
  EXPECT_THAT(Unsaved(), IsEmpty());
  Train(2);
  EXPECT_THAT(Unsaved(), ElementsAre(IsUnsaved(kJob, 2, "", 0)));
  Save("by-hand");
  EXPECT_THAT(Unsaved(), IsEmpty());
  Train(1);
  EXPECT_THAT(Unsaved(), ElementsAre(IsUnsaved(kJob, 3, "by-hand", 2)));
}

// By the state, not the step, and against what a restart would restore: a
// job that loaded an older checkpoint left the newer one's history, so a
// restart restores the loaded one (not the newest), and the job retrained
// to the newest one's step is unsaved. (By step against the newest, the
// loaded state read as unsaved and the retrained one as saved.)
TEST_F(SaveBeforeStopTest, AJobRetrainedToTheNewestCheckpointsStepIsUnsaved) {
  Train(1);
  Save("a");
  Train(1);
  Save("b");
  EXPECT_EQ(StateCheckpoint(), "b");
  EXPECT_THAT(Unsaved(), IsEmpty());
  Load("a");
  EXPECT_EQ(StateCheckpoint(), "a");
  EXPECT_THAT(Unsaved(), IsEmpty());
  Train(1);
  EXPECT_EQ(StateCheckpoint(), "");
  EXPECT_THAT(Unsaved(), ElementsAre(IsUnsaved(kJob, 2, "a", 1)));
  Load("b");
  EXPECT_THAT(Unsaved(), IsEmpty());
}

// A restarted coordinator still knows which checkpoint the re-adopted ranks'
// state is (the state store keeps it): the job is not saved again.
TEST_F(SaveBeforeStopTest, AfterACoordinatorRestartTheSavedStateIsStillKnown) {
  Train(1);
  Save("a");
  EXPECT_THAT(Unsaved(), IsEmpty());
  const auto before = client_->GetJob(kJob);
  ASSERT_TRUE(before.ok()) << before.status();
  std::string stored;
  ASSERT_TRUE(cluster_->KillAndRestartCoordinator([&] { stored = StoredStateCheckpoint(); }).ok());
  EXPECT_EQ(stored, "a");
  auto ready = client_->WaitForState(kJob, {v1::READY}, absl::Seconds(120), {v1::RECOVERING});
  ASSERT_TRUE(ready.ok()) << ready.status();
  const auto after = client_->GetJob(kJob);
  ASSERT_TRUE(after.ok()) << after.status();
  // Re-adopted where they were (a roll back would have loaded "a" again,
  // and known it that way).
  ASSERT_EQ(after->epoch(), before->epoch()) << "rolled back instead of re-adopted";
  EXPECT_EQ(after->state_checkpoint(), "a");
  EXPECT_THAT(Unsaved(), IsEmpty());
  // And the re-adopted job's next step clears it, as before the restart.
  Train(1);
  EXPECT_EQ(StateCheckpoint(), "");
  EXPECT_THAT(Unsaved(), ElementsAre(IsUnsaved(kJob, 2, "a", 1)));
}

// The history a load started is kept across a restart too: a job that loaded
// the older of two checkpoints and whose coordinator restarted (it rolls
// back, since its last batch loaded) restores that one, not the newer one of
// the history it left, and is saved as what a restart restores.
TEST_F(SaveBeforeStopTest, AfterACoordinatorRestartTheLoadedHistoryIsStillKnown) {
  Train(1);
  Save("a");
  Train(1);
  Save("b");
  Load("a");
  ASSERT_TRUE(cluster_->KillAndRestartCoordinator().ok());
  auto ready = client_->WaitForState(kJob, {v1::READY}, absl::Seconds(120), {v1::RECOVERING});
  ASSERT_TRUE(ready.ok()) << ready.status();
  const auto after = client_->GetJob(kJob);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->step(), 1);
  EXPECT_EQ(after->last_recovery().checkpoint(), "a");
  EXPECT_EQ(after->state_checkpoint(), "a");
  EXPECT_THAT(Unsaved(), IsEmpty());
}

// The coordinator dies while it trains past its saved state: the store
// already said "not known" when the first step's batch was sent (the clear
// is in the batch's journal entry), so the restart does not take the
// trained state for the checkpoint.
TEST_F(SaveBeforeStopTest, AStepSentBeforeACoordinatorCrashIsNotTakenForTheSavedState) {
  Train(1);
  Save("a");
  const absl::Status cut = client_->Train(kJob, 10, 0, [&](const v1::StepResult& r) {
    if (r.step() == 2) cluster_->coordinator().Signal(SIGKILL);
  });
  EXPECT_EQ(cut.code(), absl::StatusCode::kUnavailable) << cut;
  std::string stored;
  ASSERT_TRUE(cluster_->KillAndRestartCoordinator([&] { stored = StoredStateCheckpoint(); }).ok());
  EXPECT_EQ(stored, "");
  // The training operation goes on by itself to step 11.
  auto idle = client_->WaitForState(kJob, {v1::IDLE}, absl::Seconds(120));
  ASSERT_TRUE(idle.ok()) << idle.status();
  EXPECT_EQ(StateCheckpoint(), "");
  EXPECT_THAT(Unsaved(), ElementsAre(IsUnsaved(kJob, 11, "a", 1)));
}

// An unnamed save takes step-N; at a step whose step-N another history took
// (the job loaded an older checkpoint and trained back), the next free
// suffix (it was refused as taken); of this very state, it is refused.
TEST_F(SaveBeforeStopTest, AnUnnamedSaveAtAStepAnotherHistoryTookTakesTheNextSuffix) {
  const auto save_unnamed = [&]() -> absl::StatusOr<std::string> {
    v1::SaveCheckpointRequest request;
    request.set_job(kJob);
    auto saved = client_->SaveCheckpoint(request);
    if (!saved.ok()) return saved.status();
    return saved->name();
  };
  Train(1);
  EXPECT_EQ(save_unnamed().value_or("(failed)"), "step-00000001");
  Train(1);
  EXPECT_EQ(save_unnamed().value_or("(failed)"), "step-00000002");
  Load("step-00000001");
  Train(1);
  const absl::StatusOr<std::string> retrained = save_unnamed();
  ASSERT_TRUE(retrained.ok()) << retrained.status();
  EXPECT_EQ(*retrained, "step-00000002-2");
  EXPECT_EQ(StateCheckpoint(), "step-00000002-2");
  const absl::StatusOr<std::string> again = save_unnamed();
  EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  // What a restart restores is this history's, not the other step 2.
  auto listed = client_->ListCheckpoints(kJob);
  ASSERT_TRUE(listed.ok()) << listed.status();
  std::string target;
  for (const v1::CheckpointInfo& c : *listed) {
    if (c.recovery_target()) target = c.name();
  }
  EXPECT_EQ(target, "step-00000002-2");
  EXPECT_THAT(Unsaved(), IsEmpty());
}

TEST_F(SaveBeforeStopTest, ASecondStopInTheSameSecondTakesTheNextName) {
  const absl::Time now =
      absl::FromCivil(absl::CivilSecond(2026, 11, 29, 6, 0, 0), absl::UTCTimeZone());
  Train(1);
  std::vector<std::string> said;
  const auto say = [&said](const std::string& line) { said.push_back(line); };
  ASSERT_TRUE(SaveUnsavedJobs(*client_, Unsaved(), now, say).ok());
  Train(1);
  ASSERT_TRUE(SaveUnsavedJobs(*client_, Unsaved(), now, say).ok());
  auto checkpoints = client_->ListCheckpoints(kJob);
  ASSERT_TRUE(checkpoints.ok()) << checkpoints.status();
  ASSERT_EQ(checkpoints->size(), 2u);
  EXPECT_EQ((*checkpoints)[0].name(), "stop-20261129-060000");
  EXPECT_EQ((*checkpoints)[0].step(), 1);
  EXPECT_EQ((*checkpoints)[1].name(), "stop-20261129-060000-2");
  EXPECT_EQ((*checkpoints)[1].step(), 2);
  EXPECT_THAT(said.back(), ::testing::HasSubstr("saved 'stop-20261129-060000-2' at step 2"));
}

}  // namespace
}  // namespace flatshard
