// Where a re-adopted job goes on, from the record, the journaled last batch
// and the seq the ranks agree on: at step boundaries only.
#include "coordinator/readoption.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

using ::testing::HasSubstr;

JobRecord Record() {
  JobRecord record;
  record.epoch = 3;
  record.step = 10;
  record.data_position = 40;
  record.last_seq = 7;
  return record;
}

// A step batch of epoch 3 at `seq`, journaled at step 12, data position 47.
BatchRecord StepBatch(uint64_t seq, bool sync, bool mid_step_before) {
  BatchRecord last;
  last.batch.set_job_epoch(3);
  last.batch.set_seq(seq);
  last.batch.mutable_step()->set_step(47);
  last.batch.mutable_step()->set_sync_gradients(sync);
  last.step_after = sync ? 13 : 12;
  last.data_position_after = 48;
  last.mid_step_before = mid_step_before;
  return last;
}

// A restore from peer snapshots of epoch 3 at seq 20, journaled at the step
// it moves the ranks to.
BatchRecord RestoreBatch(int64_t step, int64_t data_position) {
  BatchRecord last;
  last.batch.set_job_epoch(3);
  last.batch.set_seq(20);
  last.batch.mutable_checkpoint()->mutable_restore_peer_snapshot()->set_step(step);
  last.step_after = step;
  last.data_position_after = data_position;
  return last;
}

TEST(ReadoptionTest, WithoutAJournaledBatchTheRecordIsWhereTheRanksAre) {
  auto point = ReadoptionPointAt(Record(), std::nullopt, 7);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_EQ(point->step, 10);
  EXPECT_EQ(point->data_position, 40);
  EXPECT_EQ(point->last_seq, 7u);
  // Another epoch's batch says nothing about this one.
  BatchRecord old = StepBatch(30, true, false);
  old.batch.set_job_epoch(2);
  EXPECT_TRUE(ReadoptionPointAt(Record(), old, 7).ok());
  EXPECT_EQ(ReadoptionPointAt(Record(), std::nullopt, 8).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(ReadoptionTest, AStepsLastBatchThatRanEverywhereEndsTheStep) {
  auto point = ReadoptionPointAt(Record(), StepBatch(20, true, true), 20);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_EQ(point->step, 13);
  EXPECT_EQ(point->data_position, 48);
  EXPECT_EQ(point->last_seq, 20u);
}

TEST(ReadoptionTest, ABatchThatRanNowhereAtAStepBoundaryIsSentAgain) {
  // The first micro-batch of a step, or a step without micro-batches.
  for (bool sync : {false, true}) {
    auto point = ReadoptionPointAt(Record(), StepBatch(20, sync, false), 19);
    ASSERT_TRUE(point.ok()) << point.status();
    EXPECT_EQ(point->step, 12);
    EXPECT_EQ(point->data_position, 47);
    EXPECT_EQ(point->last_seq, 19u);
  }
}

TEST(ReadoptionTest, RanksBetweenAStepsMicroBatchesAreNotReadopted) {
  // A micro-batch ran everywhere: the step's next one was never sent.
  auto ran = ReadoptionPointAt(Record(), StepBatch(20, false, false), 20);
  EXPECT_EQ(ran.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(ran.status().message(), HasSubstr("between the no_sync micro-batches"));
  // A later micro-batch, or the sync batch, ran nowhere after earlier ones.
  for (bool sync : {false, true}) {
    auto nowhere = ReadoptionPointAt(Record(), StepBatch(20, sync, true), 19);
    EXPECT_EQ(nowhere.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_THAT(nowhere.status().message(), HasSubstr("between the no_sync micro-batches"));
  }
}

// A restore from peer snapshots that the job went on from: re-adopted at the
// step it restored (journaled at it), not at the step the job had failed at.
TEST(ReadoptionTest, ARestoreFromPeerSnapshotsIsReadoptedAtTheRestoredStep) {
  auto point = ReadoptionPointAt(Record(), RestoreBatch(10, 40), 20);
  ASSERT_TRUE(point.ok()) << point.status();
  EXPECT_EQ(point->step, 10);
  EXPECT_EQ(point->data_position, 40);
}

TEST(ReadoptionTest, ALoadOrAnUnexplainedSeqIsRefused) {
  BatchRecord load;
  load.batch.set_job_epoch(3);
  load.batch.set_seq(20);
  load.batch.mutable_checkpoint()->mutable_load_shard()->set_apply(true);
  EXPECT_THAT(ReadoptionPointAt(Record(), load, 20).status().message(),
              HasSubstr("loaded a checkpoint"));
  // A restore from peer snapshots whose ranks failed it: the recovery went
  // on from initialization (the record's step 10 here), not from the step
  // the restore was journaled at.
  EXPECT_THAT(ReadoptionPointAt(Record(), RestoreBatch(9, 36), 20).status().message(),
              HasSubstr("restored peer snapshots, and the job did not go on from them"));
  EXPECT_THAT(ReadoptionPointAt(Record(), StepBatch(20, true, false), 17).status().message(),
              HasSubstr("another seq than the coordinator's last batch"));
}

}  // namespace
}  // namespace flatshard
