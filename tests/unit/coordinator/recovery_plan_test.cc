// ChooseRecovery (coordinator/recovery_plan.h): who takes which seat after a
// rank failed, and the world size a job shrinks to when spares are missing.
#include "coordinator/recovery_plan.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "core/job_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/unit/core/test_paths.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

v1::JobSpec Spec(int world, int global_batch) {
  auto spec = ParseJobSpec(
      absl::StrCat("name: j\nmodel: mlp.yaml\nwrap_policy: module-type:Residual\nworld_size: ",
                   world, "\ndata: {global_batch_size: ", global_batch, "}\n"),
      "j.yaml", testing_paths::SourceDir() + "/examples");
  EXPECT_TRUE(spec.ok()) << spec.status();
  return *spec;
}

std::vector<WorkerRecord> Workers(const std::vector<std::string>& ids,
                                  const std::string& device = "cpu") {
  std::vector<WorkerRecord> out;
  for (const std::string& id : ids) {
    WorkerRecord w;
    w.worker_id = id;
    w.device = device;
    out.push_back(w);
  }
  return out;
}

std::vector<std::string> Ids(const std::vector<WorkerRecord>& members) {
  std::vector<std::string> ids;
  ids.reserve(members.size());
  for (const WorkerRecord& m : members) ids.push_back(m.worker_id);
  return ids;
}

TEST(RecoveryPlanTest, SparesFillTheFailedSeatsAtTheSameWorldSize) {
  v1::JobSpec spec = Spec(4, 32);
  (*spec.mutable_rank_by_worker_id())["a"] = 0;  // pinned ranks give way
  auto choice = ChooseRecovery(spec, RecoverySettings{},
                               {Workers({"a", "b", "d"}), Workers({"s1", "s2"}), ""});
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_THAT(Ids(choice->members), ::testing::ElementsAre("a", "b", "d", "s1"));
  EXPECT_TRUE(choice->spare_used);
  EXPECT_EQ(choice->config.world_size, 4);
  EXPECT_TRUE(choice->spec.rank_by_worker_id().empty());
}

TEST(RecoveryPlanTest, ShrinksToTheLargestSizeTheGlobalBatchDivides) {
  // 3 survivors, no spare: 32 does not split 3 ways, so 2.
  auto choice = ChooseRecovery(Spec(4, 32), RecoverySettings{}, {Workers({"a", "b", "c"}), {}, ""});
  ASSERT_TRUE(choice.ok()) << choice.status();
  EXPECT_EQ(choice->config.world_size, 2);
  EXPECT_EQ(choice->spec.world_size(), 2);
  EXPECT_EQ(choice->spec.data().global_batch_size(), 32);
  EXPECT_THAT(Ids(choice->members), ::testing::ElementsAre("a", "b"));
  EXPECT_FALSE(choice->spare_used);
  // With a batch 3 divides, all 3 stay.
  auto three = ChooseRecovery(Spec(4, 24), RecoverySettings{}, {Workers({"a", "b", "c"}), {}, ""});
  ASSERT_TRUE(three.ok());
  EXPECT_EQ(three->config.world_size, 3);
}

TEST(RecoveryPlanTest, MinWorldSizeAndDeviceKindBoundTheChoice) {
  RecoverySettings no_shrink;
  no_shrink.min_world_size = 4;
  auto refused = ChooseRecovery(Spec(4, 32), no_shrink,
                                {Workers({"a", "b", "c"}), Workers({"g1"}, "cuda"), ""});
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("3 surviving worker(s) and 0 spare(s) are live"));
  EXPECT_THAT(std::string(refused.status().message()), HasSubstr("min_world_size 4"));
  // Nobody left at all.
  EXPECT_FALSE(ChooseRecovery(Spec(2, 8), RecoverySettings{}, {}).ok());
  // No survivor: the job's kind still decides, not the spares' order.
  std::vector<WorkerRecord> mixed = Workers({"g1"}, "cuda");
  for (const WorkerRecord& w : Workers({"c1", "c2"})) mixed.push_back(w);
  auto cpu_only = ChooseRecovery(Spec(2, 8), RecoverySettings{}, {{}, mixed, "cpu"});
  ASSERT_TRUE(cpu_only.ok()) << cpu_only.status();
  EXPECT_EQ(Ids(cpu_only->members), (std::vector<std::string>{"c1", "c2"}));
}

// The wait for seats counts spares by the rule the choice seats them by.
TEST(RecoveryPlanTest, TheSeatDeviceIsTheJobsElseTheFirstSurvivors) {
  EXPECT_EQ(SeatDevice({Workers({"a"}, "sim"), Workers({"g1"}, "cuda"), "cuda"}), "cuda");
  EXPECT_EQ(SeatDevice({Workers({"a"}, "sim"), Workers({"g1"}, "cuda"), ""}), "sim");
  EXPECT_EQ(SeatDevice({{}, Workers({"g1"}, "cuda"), ""}), "");
  // An epoch that recorded no device (a state dir from before devices were
  // recorded): the survivor's kind bounds the spares, so one spare of
  // another kind does not fill the seat.
  RecoverySettings no_shrink;
  no_shrink.min_world_size = 2;
  EXPECT_FALSE(
      ChooseRecovery(Spec(2, 8), no_shrink, {Workers({"a"}, "sim"), Workers({"g1"}, "cuda"), ""})
          .ok());
}

}  // namespace
}  // namespace flatshard
