// What `flatshard up` saves before it stops (client/save_before_stop.h),
// against a real coordinator and workers: which jobs the checkpoint a
// restart would restore is behind, and the names their saves take.
#include "client/save_before_stop.h"

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
#include "tests/integration/mlp_cluster.h"

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr char kJob[] = "mlp-demo";

class SaveBeforeStopTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<testing::MlpCluster> started = testing::StartMlpCluster("save-before-stop", 2);
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
  std::vector<UnsavedJob> Unsaved() {
    auto unsaved = FindUnsavedJobs(*client_);
    EXPECT_TRUE(unsaved.ok()) << unsaved.status();
    return unsaved.ok() ? *unsaved : std::vector<UnsavedJob>{};
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<FlatshardClient> client_;
};

MATCHER_P3(IsUnsaved, name, step, restored_step, "") {
  return arg.name == name && arg.step == step && arg.restored_step == restored_step;
}

TEST_F(SaveBeforeStopTest, AJobIsUnsavedWhileItsNewestCheckpointIsBehindItsStep) {
  // At its initialization: a restart makes it again from its spec.
  EXPECT_THAT(Unsaved(), IsEmpty());
  Train(2);
  EXPECT_THAT(Unsaved(), ElementsAre(IsUnsaved(kJob, 2, 0)));
  Save("by-hand");
  EXPECT_THAT(Unsaved(), IsEmpty());
  Train(1);
  EXPECT_THAT(Unsaved(), ElementsAre(IsUnsaved(kJob, 3, 2)));
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
