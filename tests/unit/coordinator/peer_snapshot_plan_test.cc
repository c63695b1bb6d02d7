// Which peer snapshot generation a recovery restores (coordinator/peer_snapshot_plan.h).
#include "coordinator/peer_snapshot_plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

using ::testing::ElementsAre;

v1::PeerSnapshotHeld Held(uint64_t epoch, int64_t step, int rank, int world, bool own) {
  v1::PeerSnapshotHeld h;
  h.set_job("j");
  h.set_epoch(epoch);
  h.set_step(step);
  h.set_rank(rank);
  h.set_world_size(world);
  h.set_own(own);
  h.set_bytes(100);
  return h;
}

// What worker w<r> of a 4-rank epoch 1 holds after the snapshots of `steps`:
// its own and its predecessor's.
std::vector<v1::PeerSnapshotHeld> RingHoldings(int rank, const std::vector<int64_t>& steps) {
  std::vector<v1::PeerSnapshotHeld> held;
  for (int64_t s : steps) {
    held.push_back(Held(1, s, rank, 4, true));
    held.push_back(Held(1, s, (rank + 3) % 4, 4, false));
  }
  return held;
}

PeerSnapshotMarks Marks(const std::vector<int64_t>& steps) {
  PeerSnapshotMarks marks;
  for (int64_t s : steps) marks[{1, s}] = PeerSnapshotMark{4, s * 10};
  return marks;
}

TEST(PeerSnapshotPlanTest, TheSuccessorsCopyStandsInForTheFailedRank) {
  std::map<std::string, std::vector<v1::PeerSnapshotHeld>> held;
  for (int r : {0, 1, 3}) held["w" + std::to_string(r)] = RingHoldings(r, {4, 5});
  // w2 failed; the spare s took its seat (rank 2) and holds nothing.
  auto choice = ChoosePeerSnapshot("j", {"w0", "w1", "s", "w3"}, held, Marks({4, 5}), -1);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->step, 5);
  EXPECT_EQ(choice->data_position, 50);
  EXPECT_THAT(choice->holder, ElementsAre(0, 1, 3, 3));  // w3 holds rank 2's copy
  EXPECT_EQ(choice->copies_used, 1);
}

TEST(PeerSnapshotPlanTest, ANewerGenerationWithAHoleGivesWayToAnOlderOne) {
  std::map<std::string, std::vector<v1::PeerSnapshotHeld>> held;
  for (int r : {0, 1}) held["w" + std::to_string(r)] = RingHoldings(r, {4, 5});
  // w3's copy of step 5 never arrived (rank 2 died while sending it).
  held["w3"] = RingHoldings(3, {4});
  held["w3"].push_back(Held(1, 5, 3, 4, true));
  auto choice = ChoosePeerSnapshot("j", {"w0", "w1", "w3"}, held, Marks({4, 5}), -1);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->step, 4);
  EXPECT_THAT(choice->holder, ElementsAre(0, 1, 2, 2));  // new ranks: shrunk to 3
}

TEST(PeerSnapshotPlanTest, AdjacentFailuresLeaveNoGeneration) {
  std::map<std::string, std::vector<v1::PeerSnapshotHeld>> held;
  for (int r : {0, 3}) held["w" + std::to_string(r)] = RingHoldings(r, {4, 5});
  // Ranks 1 and 2 both gone: rank 1's only copy was on rank 2.
  EXPECT_FALSE(ChoosePeerSnapshot("j", {"w0", "w3"}, held, Marks({4, 5}), -1).has_value());
}

TEST(PeerSnapshotPlanTest, OnlyNewerThanTheCheckpointOrderedAndOfThisJob) {
  std::map<std::string, std::vector<v1::PeerSnapshotHeld>> held;
  for (int r : {0, 1, 2, 3}) held["w" + std::to_string(r)] = RingHoldings(r, {4, 5});
  const std::vector<std::string> all{"w0", "w1", "w2", "w3"};
  // A checkpoint of step 5 is as new: no snapshot is worth restoring.
  EXPECT_FALSE(ChoosePeerSnapshot("j", all, held, Marks({4, 5}), 5).has_value());
  // Held but never confirmed by the coordinator (no mark): not used.
  auto choice = ChoosePeerSnapshot("j", all, held, Marks({4}), -1);
  ASSERT_TRUE(choice.has_value());
  EXPECT_EQ(choice->step, 4);
  EXPECT_EQ(choice->copies_used, 0);  // everyone's own beats a copy
  // Another job's snapshots do not count.
  EXPECT_FALSE(ChoosePeerSnapshot("other", all, held, Marks({4, 5}), -1).has_value());
}

}  // namespace
}  // namespace flatshard
