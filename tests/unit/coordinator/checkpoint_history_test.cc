// ChooseRecoveryCheckpoint: the newest checkpoint of the ranks' history that
// the world can load, not the newest of all.
#include "coordinator/checkpoint_history.h"

#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace flatshard {
namespace {

v1::CheckpointInfo Checkpoint(const std::string& name, int64_t step, int64_t created,
                              v1::StateDictType type = v1::SHARDED_STATE_DICT, int world = 4) {
  v1::CheckpointInfo c;
  c.set_name(name);
  c.set_step(step);
  c.set_created_unix_micros(created);
  c.set_state_dict_type(type);
  c.set_world_size(world);
  return c;
}

std::string Chosen(const std::vector<v1::CheckpointInfo>& committed, int world,
                   const CheckpointHistory& history) {
  const auto chosen = ChooseRecoveryCheckpoint(committed, world, history);
  return chosen.has_value() ? chosen->name() : "(none)";
}

// Oldest first, as the catalog lists them.
const std::vector<v1::CheckpointInfo> kSaved = {
    Checkpoint("step-3", 3, 30), Checkpoint("step-6", 6, 60), Checkpoint("step-9", 9, 90)};

TEST(CheckpointHistoryTest, BeforeAnyLoadTheNewestLoadableOne) {
  EXPECT_EQ(Chosen(kSaved, 4, {}), "step-9");
  EXPECT_EQ(Chosen({}, 4, {}), "(none)");
  std::vector<v1::CheckpointInfo> local = kSaved;
  local.push_back(Checkpoint("local-10", 10, 100, v1::LOCAL_STATE_DICT, 4));
  EXPECT_EQ(Chosen(local, 4, {}), "local-10");
  EXPECT_EQ(Chosen(local, 2, {}), "step-9");  // LOCAL only at its world size
}

// A job created over an earlier job's checkpoints (its history began at its
// creation, 95): only its own saves are its history, and before any, its
// initialization (nullopt), not the earlier job's newest.
TEST(CheckpointHistoryTest, ANewJobsHistoryIsItsOwnSavesNotAnEarlierJobs) {
  const CheckpointHistory created_at_95{"", 0, 0, 95};
  EXPECT_EQ(Chosen(kSaved, 4, created_at_95), "(none)");
  std::vector<v1::CheckpointInfo> saved = kSaved;
  saved.push_back(Checkpoint("step-2", 2, 100));
  EXPECT_EQ(Chosen(saved, 4, created_at_95), "step-2");
  // Its own LOCAL one at another world size: nothing else of its to fall back to.
  saved.back().set_state_dict_type(v1::LOCAL_STATE_DICT);
  EXPECT_EQ(Chosen(saved, 2, created_at_95), "(none)");
}

TEST(CheckpointHistoryTest, AfterALoadTheLoadedOneNotTheNewerOnesOfTheHistoryItLeft) {
  const CheckpointHistory loaded_3{"step-3", 3, 30, 95};
  EXPECT_EQ(Chosen(kSaved, 4, loaded_3), "step-3");
  // Saves begun since the load (at its start too) are of its history, the
  // newest first.
  std::vector<v1::CheckpointInfo> since = kSaved;
  since.push_back(Checkpoint("step-6-2", 6, 95));
  EXPECT_EQ(Chosen(since, 4, loaded_3), "step-6-2");
  since.push_back(Checkpoint("local-7", 7, 130, v1::LOCAL_STATE_DICT, 4));
  EXPECT_EQ(Chosen(since, 2, loaded_3), "step-6-2");
  EXPECT_EQ(Chosen(since, 4, loaded_3), "local-7");
  // One microsecond before the load is the history it left.
  EXPECT_EQ(Chosen({Checkpoint("step-3", 3, 30), Checkpoint("step-9", 9, 94)}, 4, loaded_3),
            "step-3");
}

// When nothing of the history is left, its past (begun before the loaded
// checkpoint, at no later step), not the future it left; the newest of all
// only when it has no past either.
TEST(CheckpointHistoryTest, AHistoryWithNothingLeftFallsBackToItsPast) {
  // The loaded checkpoint (step-6, begun at 60) was deleted, nothing saved
  // since the load at 95.
  const std::vector<v1::CheckpointInfo> left = {Checkpoint("step-3", 3, 30),
                                                Checkpoint("step-9", 9, 90)};
  EXPECT_EQ(Chosen(left, 4, {"step-6", 6, 60, 95}), "step-3");
  // Or it is a LOCAL one this world cannot load.
  std::vector<v1::CheckpointInfo> local = kSaved;
  local.push_back(Checkpoint("local-4", 4, 40, v1::LOCAL_STATE_DICT, 4));
  EXPECT_EQ(Chosen(local, 2, {"local-4", 4, 40, 95}), "step-3");
  EXPECT_EQ(Chosen(local, 4, {"local-4", 4, 40, 95}), "local-4");
  // No past either: the newest of all rather than the initialization.
  EXPECT_EQ(Chosen(left, 4, {"step-1", 1, 10, 95}), "step-9");
}

// Begun before the loaded checkpoint but at a later step: the future of an
// earlier history a load left (trained to 10, loaded 5, trained to 7 and
// saved, loaded that), not this one's past.
TEST(CheckpointHistoryTest, ThePastIsNotAnEarlierHistorysFuture) {
  const std::vector<v1::CheckpointInfo> committed = {
      Checkpoint("s5", 5, 50), Checkpoint("s10", 10, 100),
      Checkpoint("s7", 7, 120, v1::LOCAL_STATE_DICT, 4)};
  // s7 (LOCAL) cannot load at world 2; its past is s5, not s10.
  EXPECT_EQ(Chosen(committed, 2, {"s7", 7, 120, 130}), "s5");
}

}  // namespace
}  // namespace flatshard
