// AwaitAsyncSave against an in-process fake worker: a background write whose
// save counter stands still is given up on at the stall timeout even while
// training moves the worker's main counter, one whose counter moves is
// waited for, a worker that answers no probe is stalled too, and without a
// stall timeout, or once the job failed, the wait is what it was.
#include "coordinator/async_save_await.h"

#include <algorithm>
#include <atomic>
#include <string>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

constexpr char kDirectory[] = "mlp/stuck.partial";

// A worker writing one async save: it answers AwaitSave at its
// `answer_at_call`-th call (0: never), and until then as a worker whose
// write still runs does, at the call's deadline.
class WritingWorker : public WorkerClient {
 public:
  void Execute(const v1::CommandBatch*, absl::Time, ExecuteDone done) override {
    done(absl::UnimplementedError("fake worker"));
  }
  void CancelAll() override {}
  absl::Status Configure(const v1::ConfigureRequest&, absl::Time) override {
    return absl::OkStatus();
  }
  absl::Status Abort(uint64_t, const std::string&, absl::Time) override { return absl::OkStatus(); }
  absl::StatusOr<v1::GetStatusResponse> GetStatus(absl::Time) override {
    const int probe = ++probes_;
    if (dead_) return absl::UnavailableError("connection refused");
    if (probe == finish_at_probe_) finished_ = true;  // its final fsync ends now
    v1::GetStatusResponse response;
    response.set_progress(static_cast<uint64_t>(probe));  // training moves on
    if (!old_worker_) response.set_save_progress(write_moves_ ? static_cast<uint64_t>(probe) : 7);
    return response;
  }
  absl::StatusOr<v1::CommandResult> AwaitSave(const std::string& directory,
                                              absl::Time deadline) override {
    const int call = ++calls_;
    last_deadline_ = deadline;
    longest_call_ = std::max(longest_call_, deadline - absl::Now());
    if (directory != kDirectory) return absl::NotFoundError(absl::StrCat("no save ", directory));
    if (!answer_.ok()) return answer_;
    if (finished_ || (answer_at_call_ > 0 && call >= answer_at_call_)) {
      v1::CommandResult result;
      result.set_rank(1);
      return result;
    }
    // The worker's own wait for the write: it returns at the deadline.
    std::this_thread::sleep_until(absl::ToChronoTime(deadline));
    return absl::DeadlineExceededError("async save still writing");
  }
  absl::Status Summon(const v1::CommandBatch&, absl::Time, const ChunkSink&) override {
    return absl::OkStatus();
  }
  std::string address() const override { return "fake:1"; }

  bool write_moves_ = false;
  bool dead_ = false;
  bool old_worker_ = false;  // sends no save_progress
  int finish_at_probe_ = 0;  // > 0: the write ends at that probe, its counter still
  std::atomic<bool> finished_{false};
  int answer_at_call_ = 0;
  absl::Status answer_;  // not OK: every call answers it
  std::atomic<int> probes_{0};
  std::atomic<int> calls_{0};
  absl::Time last_deadline_;
  absl::Duration longest_call_ = absl::ZeroDuration();  // the longest deadline given
};

TEST(AsyncSaveAwaitTest, AStillWriteIsGivenUpAtTheStallTimeoutWhileTrainingMovesOn) {
  WritingWorker worker;
  const absl::Time start = absl::Now();
  AwaitedSave awaited =
      AwaitAsyncSave(worker, 1, kDirectory, start + absl::Seconds(60), absl::Milliseconds(200), {});
  ASSERT_TRUE(awaited.stall.has_value());
  EXPECT_EQ(awaited.stall->rank, 1);
  EXPECT_GE(awaited.stall->still_for, absl::Milliseconds(200));
  EXPECT_EQ(awaited.stall->progress, 7u);
  EXPECT_EQ(awaited.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  const std::string message(awaited.result.status().message());
  EXPECT_THAT(message, HasSubstr("async write into 'mlp/stuck.partial' made no progress for "));
  EXPECT_THAT(message, HasSubstr("(its save progress counter stayed at 7)"));
  EXPECT_THAT(message, HasSubstr("--stall-timeout is 200ms"));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30)) << "waited for the deadline, not the stall";
  // Cut into probe intervals (20 ms at a 200 ms timeout): a call and a
  // probe each, and one last call when the stall is found.
  EXPECT_GE(worker.calls_.load(), 3);
  EXPECT_LE(worker.longest_call_, absl::Milliseconds(20));
  EXPECT_EQ(worker.probes_.load() + 1, worker.calls_.load());
}

TEST(AsyncSaveAwaitTest, AWriteWhoseCounterMovesIsWaitedForManyTimeouts) {
  WritingWorker worker;
  worker.write_moves_ = true;
  worker.answer_at_call_ = 40;  // 40 intervals of 10 ms: eight timeouts
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(50), {});
  EXPECT_FALSE(awaited.stall.has_value());
  ASSERT_TRUE(awaited.result.ok()) << awaited.result.status();
  EXPECT_EQ(awaited.result->rank(), 1);
  EXPECT_EQ(worker.calls_.load(), 40);
}

// The write ends at the very probe that finds it still for the timeout (the
// first probe starts its clock; the second, 10 ms on, is past a 10 ms
// timeout), as a last fsync, which moves no counter, would: the last look
// collects it instead of failing the rank.
TEST(AsyncSaveAwaitTest, AWriteThatEndsAsItIsFoundStillIsCollected) {
  WritingWorker worker;
  worker.finish_at_probe_ = 2;
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(10), {});
  EXPECT_FALSE(awaited.stall.has_value()) << awaited.result.status();
  ASSERT_TRUE(awaited.result.ok()) << awaited.result.status();
  EXPECT_EQ(worker.probes_.load(), 2);
  EXPECT_EQ(worker.calls_.load(), 3);
}

// A worker built before save_progress sends none: its write is awaited as
// before, in one call to the deadline, never failed as stalled.
TEST(AsyncSaveAwaitTest, AWorkerThatSendsNoSaveProgressIsAwaitedUnwatched) {
  WritingWorker worker;
  worker.old_worker_ = true;
  worker.answer_at_call_ = 2;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, deadline, absl::Milliseconds(10), {});
  EXPECT_FALSE(awaited.stall.has_value());
  ASSERT_TRUE(awaited.result.ok()) << awaited.result.status();
  EXPECT_EQ(worker.calls_.load(), 2);
  EXPECT_EQ(worker.probes_.load(), 1);
  EXPECT_EQ(worker.last_deadline_, deadline);
}

TEST(AsyncSaveAwaitTest, AWorkerThatAnswersNoProbeIsStalledToo) {
  WritingWorker worker;
  worker.dead_ = true;
  AwaitedSave awaited = AwaitAsyncSave(worker, 0, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(100), {});
  ASSERT_TRUE(awaited.stall.has_value());
  EXPECT_FALSE(awaited.stall->progress.has_value());
  EXPECT_THAT(std::string(awaited.result.status().message()),
              HasSubstr("(it did not answer its progress probes)"));
}

TEST(AsyncSaveAwaitTest, TheDeadlineEndsTheWaitAsStillWritingNotAsAStall) {
  WritingWorker worker;
  worker.write_moves_ = true;
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Milliseconds(150),
                                       absl::Seconds(10), {});
  EXPECT_FALSE(awaited.stall.has_value());
  EXPECT_EQ(awaited.result.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(awaited.result.status().message()), HasSubstr("still writing"));
}

TEST(AsyncSaveAwaitTest, WithoutAStallTimeoutItIsOneCallToTheDeadline) {
  WritingWorker worker;
  worker.answer_at_call_ = 1;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, deadline, absl::ZeroDuration(), {});
  ASSERT_TRUE(awaited.result.ok()) << awaited.result.status();
  EXPECT_EQ(worker.calls_.load(), 1);
  EXPECT_EQ(worker.last_deadline_, deadline);
  EXPECT_EQ(worker.probes_.load(), 0);
}

TEST(AsyncSaveAwaitTest, AnAnswerOtherThanStillWritingEndsTheWaitAtOnce) {
  WritingWorker worker;
  worker.answer_ = absl::UnavailableError("connection refused");
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(100), {});
  EXPECT_FALSE(awaited.stall.has_value());
  EXPECT_EQ(awaited.result.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(worker.calls_.load(), 1);
  EXPECT_EQ(worker.probes_.load(), 0);
}

TEST(AsyncSaveAwaitTest, AJobThatFailedMeanwhileEndsTheWaitBeforeTheNextCall) {
  WritingWorker worker;
  worker.write_moves_ = true;
  std::atomic<int> asked{0};
  // The job fails during the third interval.
  AwaitedSave awaited = AwaitAsyncSave(worker, 1, kDirectory, absl::Now() + absl::Seconds(60),
                                       absl::Milliseconds(100), [&asked] { return ++asked > 3; });
  EXPECT_FALSE(awaited.stall.has_value());
  EXPECT_EQ(awaited.result.status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(worker.calls_.load(), 3);
}

}  // namespace
}  // namespace flatshard
