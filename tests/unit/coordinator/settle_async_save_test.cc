// SettleAsyncSave, the verdict over the ranks' answers to an async save:
// every rank's write committed in rank order; an answer carrying another
// save's batch seq refused; whom a failure blames (a gone rank, then the
// job's own failure, then the rest; the stall before anything); a refused
// batch fails the save though every writer finished.
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "rpc/status_proto.h"

#include "coordinator/async_save_await.h"

namespace flatshard {
namespace {

// One rank's answer: its write done (for batch `seq`), failed with
// `checkpoint_error`, or no answer at all (`status`).
AwaitedSave Answer(int rank, uint64_t seq, const absl::Status& checkpoint_error = {}) {
  v1::CommandResult result;
  result.set_rank(rank);
  result.set_seq(seq);
  *result.mutable_checkpoint_status() = StatusToProto(checkpoint_error);
  return {result, {}};
}
AwaitedSave NoAnswer(const absl::Status& status) { return {status, {}}; }

constexpr uint64_t kSeq = 9;

TEST(SettleAsyncSaveTest, EveryRankWrittenIsCommittedInRankOrder) {
  AwaitedSaves awaited;
  for (int r = 0; r < 3; ++r) awaited.ranks.push_back(Answer(r, kSeq));
  absl::StatusOr<std::vector<v1::CommandResult>> written =
      SettleAsyncSave(std::move(awaited), kSeq, {}, {}, {});
  ASSERT_TRUE(written.ok()) << written.status();
  ASSERT_EQ(written->size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ((*written)[static_cast<size_t>(r)].rank(), r);
}

// A failed save's name taken again: rank 1 refused this save's batch, and
// its worker still holds the outcome of the earlier save into the directory.
TEST(SettleAsyncSaveTest, AnAnswerForAnotherBatchIsNotThisSaves) {
  AwaitedSaves awaited;
  awaited.ranks = {Answer(0, kSeq), Answer(1, kSeq - 4)};
  absl::StatusOr<std::vector<v1::CommandResult>> written = SettleAsyncSave(
      std::move(awaited), kSeq, absl::FailedPreconditionError("rank 1 refused the batch"), {}, {});
  ASSERT_FALSE(written.ok());
  EXPECT_EQ(written.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(written.status().message(),
            "rank 1 did not finish its write: its answer is for batch seq 5, not 9");
}

TEST(SettleAsyncSaveTest, AFailureBlamesTheGoneRankThenTheJobThenTheRest) {
  const absl::Status job_failure = absl::AbortedError("rank 2 (w2) was lost");
  const auto ranks = [] {
    AwaitedSaves awaited;
    awaited.ranks = {Answer(0, kSeq, absl::DataLossError("short write")),
                     NoAnswer(absl::CancelledError("gave up")),
                     NoAnswer(absl::UnavailableError("connection refused"))};
    return awaited;
  };
  absl::StatusOr<std::vector<v1::CommandResult>> written =
      SettleAsyncSave(ranks(), kSeq, {}, {}, job_failure);
  EXPECT_EQ(written.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(written.status().message(), "rank 2 did not finish its write: connection refused");

  AwaitedSaves without_gone = ranks();
  without_gone.ranks.pop_back();
  written = SettleAsyncSave(without_gone, kSeq, {}, {}, job_failure);
  EXPECT_EQ(written.status(), job_failure);
  written = SettleAsyncSave(without_gone, kSeq, {}, {}, {});
  EXPECT_EQ(written.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(written.status().message(), "rank 1 did not finish its write: gave up");
  without_gone.ranks.pop_back();
  written = SettleAsyncSave(without_gone, kSeq, {}, {}, {});
  EXPECT_EQ(written.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(written.status().message(), "rank 0: short write");
  // A refusal of the batch is the save's first failure: the write that
  // failed came after it.
  const absl::Status refused = absl::FailedPreconditionError("rank 3: refused");
  EXPECT_EQ(SettleAsyncSave(without_gone, kSeq, refused, {}, {}).status(), refused);
}

TEST(SettleAsyncSaveTest, ARefusedBatchFailsTheSaveThoughEveryWriterFinished) {
  AwaitedSaves awaited;
  awaited.ranks = {Answer(0, kSeq), Answer(1, kSeq)};
  const absl::Status refused = absl::FailedPreconditionError("rank 2: no such unit");
  EXPECT_EQ(SettleAsyncSave(std::move(awaited), kSeq, refused, {}, {}).status(), refused);
}

// The stall's rank is the cause; the others' waits were given up on, so
// their answers (a gone rank's too) are not read.
TEST(SettleAsyncSaveTest, AfterAStallTheOtherAnswersAreNotRead) {
  const auto stuck = [] {
    AwaitedSaves awaited;
    awaited.ranks = {NoAnswer(absl::UnavailableError("connection refused")),
                     NoAnswer(absl::DeadlineExceededError("stuck"))};
    awaited.stalled = 1;
    return awaited;
  };
  const absl::Status stalled = absl::DeadlineExceededError("rank 1: stuck");
  const absl::Status job_failure = absl::AbortedError("rank 0 (w0) was lost");
  EXPECT_EQ(SettleAsyncSave(stuck(), kSeq, {}, stalled, job_failure).status(), stalled);
  // Not handed on, as the job had failed before it was found.
  EXPECT_EQ(SettleAsyncSave(stuck(), kSeq, {}, {}, job_failure).status(), job_failure);
  // Never a commit without the ranks' files.
  absl::StatusOr<std::vector<v1::CommandResult>> neither =
      SettleAsyncSave(stuck(), kSeq, {}, {}, {});
  EXPECT_EQ(neither.status().code(), absl::StatusCode::kInternal);
}

}  // namespace
}  // namespace flatshard
