// The sequencer's logic against in-process fake workers: seq and digest
// stamping, results by rank, the failed rank named, survivors aborted, and
// every later batch refused (docs/architecture.md §4's ordering invariant).
#include "coordinator/command_sequencer.h"

#include <atomic>
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rpc/command_batch.h"

#include "core/status_payloads.h"
#include "core/step_program.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

class FakeWorker : public WorkerClient {
 public:
  explicit FakeWorker(int rank) : rank_(rank) {}

  void Execute(const v1::CommandBatch* batch, absl::Time, ExecuteDone done) override {
    seen_.push_back(*batch);
    if (hang_) {  // answers only when cancelled
      {
        std::lock_guard<std::mutex> lock(mu_);
        pending_ = std::move(done);
      }
      hung_.set_value();
      return;
    }
    if (!fail_.ok()) {
      done(fail_);
      return;
    }
    v1::CommandResult result;
    result.set_seq(batch->seq());
    result.set_rank(rank_);
    result.set_loss(rank_ + 0.5);
    done(result);
  }
  // Answers a hung batch with success.
  void Answer() {
    ExecuteDone done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done = std::exchange(pending_, nullptr);
    }
    v1::CommandResult result;
    result.set_rank(rank_);
    if (done) done(result);
  }
  void CancelAll() override {
    if (answer_when_cancelled_) {
      Answer();  // its answer was on its way when the cancel came
      return;
    }
    ExecuteDone done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done = std::move(pending_);
      pending_ = nullptr;
    }
    if (done) done(absl::CancelledError("cancelled"));
  }
  void ConfigureAsync(v1::ConfigureRequest, absl::Time, absl::Time, ConfigureDone done) override {
    done(absl::OkStatus());
  }
  void AbortAsync(uint64_t, const std::string& reason, absl::Time, AbortDone answer) override {
    ExecuteDone done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      aborts_.push_back(reason);
      if (fail_when_aborted_) done = std::exchange(pending_, nullptr);
    }
    // A worker's collective fails when it is aborted: the batch's answer.
    if (done) done(absl::AbortedError("gloo all_gather aborted: " + reason));
    answer(absl::OkStatus());
  }
  void GetStatusAsync(absl::Time, GetStatusDone done) override {
    if (dead_) {
      done(absl::UnavailableError("connection refused"));
      return;
    }
    const int probe = ++probes_;
    v1::GetStatusResponse response;
    // A working rank's counter moves between probes; a stuck one's stays.
    response.set_progress(progressing_ ? static_cast<uint64_t>(probe) : 7);
    if (probe == answer_at_probe_) Answer();
    done(response);
  }
  void AwaitSave(const std::string&, absl::Time, AwaitSaveDone done) override {
    done(absl::UnimplementedError("fake worker"));
  }
  absl::Status Summon(const v1::CommandBatch&, absl::Time, const ChunkSink&) override {
    return absl::OkStatus();
  }
  void JoinSummonAsync(const v1::CommandBatch*, absl::Time, JoinSummonDone done) override {
    done(absl::OkStatus());
  }
  void Disconnect() override {}  // no connection of its own
  std::string address() const override { return "fake:" + std::to_string(rank_); }

  int rank_;
  absl::Status fail_;
  bool dead_ = false;
  bool hang_ = false;
  bool fail_when_aborted_ = false;
  bool progressing_ = false;
  bool answer_when_cancelled_ = false;  // a hung batch is answered with success at the cancel
  int answer_at_probe_ = 0;             // > 0: a hung batch is answered at that probe
  std::atomic<int> probes_{0};
  // std primitives, not absl's: ThreadSanitizer sees through these (the
  // Debian abseil is not instrumented).
  std::promise<void> hung_;
  std::mutex mu_;
  ExecuteDone pending_;
  std::vector<v1::CommandBatch> seen_;
  std::vector<std::string> aborts_;
};

// The stall detector off, unless a test turns it on.
constexpr BatchLimits kNoStalls{absl::Seconds(10), absl::ZeroDuration()};

struct Fixture {
  explicit Fixture(int world, BatchLimits limits = kNoStalls) {
    for (int r = 0; r < world; ++r) workers.push_back(std::make_unique<FakeWorker>(r));
    // Not owned by the sequencer: the fixture keeps them (aliasing, no owner).
    std::vector<std::shared_ptr<WorkerClient>> clients;
    for (auto& w : workers) clients.emplace_back(std::shared_ptr<void>(), w.get());
    sequencer = std::make_unique<CommandSequencer>(clients, /*epoch=*/3, limits);
  }
  std::vector<std::unique_ptr<FakeWorker>> workers;
  std::unique_ptr<CommandSequencer> sequencer;
};

v1::CommandBatch Batch() {
  v1::CommandBatch batch;
  batch.mutable_step()->add_commands()->mutable_optim_step();
  batch.mutable_step()->set_step(4);
  batch.mutable_step()->set_sync_gradients(true);
  return batch;
}

TEST(CommandSequencerTest, StampsEpochSeqAndDigestAndReturnsResultsByRank) {
  Fixture f(3);
  for (uint64_t want_seq = 1; want_seq <= 3; ++want_seq) {
    auto results = f.sequencer->Run(Batch());
    ASSERT_TRUE(results.ok()) << results.status();
    ASSERT_EQ(results->size(), 3u);
    for (int r = 0; r < 3; ++r) EXPECT_EQ((*results)[static_cast<size_t>(r)].rank(), r);
    EXPECT_EQ(f.sequencer->last_seq(), want_seq);
  }
  const v1::CommandBatch& sent = f.workers[1]->seen_.back();
  EXPECT_EQ(sent.job_epoch(), 3u);
  EXPECT_EQ(sent.seq(), 3u);
  // The digest is core's, over core's program: what a worker recomputes.
  EXPECT_EQ(sent.digest(), ProgramDigest({StepCommand::OptimStep()}, 4, true));
}

// The work a caller does while a batch runs (the next step's journal
// record) starts once every rank has been sent the batch, and the answers
// that come meanwhile are not lost: here they all come during it.
TEST(CommandSequencerTest, WorkWhileABatchRunsStartsOnceEveryRankHasItAndLosesNoAnswer) {
  Fixture f(3);
  for (auto& w : f.workers) w->hang_ = true;
  int calls = 0;
  auto results = f.sequencer->Run(Batch(), [&](const v1::CommandBatch& sent) {
    ++calls;
    EXPECT_EQ(sent.job_epoch(), 3u);
    EXPECT_EQ(sent.seq(), 1u);
    for (auto& w : f.workers) {
      ASSERT_EQ(w->seen_.size(), 1u);
      EXPECT_EQ(w->seen_[0].seq(), 1u);
    }
    EXPECT_EQ(f.sequencer->last_seq(), 0u);  // not done yet
    for (auto& w : f.workers) w->Answer();
  });
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(calls, 1);
  ASSERT_EQ(results->size(), 3u);
  for (int r = 0; r < 3; ++r) EXPECT_EQ((*results)[static_cast<size_t>(r)].rank(), r);
  EXPECT_EQ(f.sequencer->last_seq(), 1u);
}

TEST(CommandSequencerTest, RefusesABatchWithoutAKindBeforeSendingIt) {
  Fixture f(2);
  auto results = f.sequencer->Run(v1::CommandBatch());
  ASSERT_FALSE(results.ok());
  EXPECT_EQ(results.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(results.status().message()), HasSubstr("kind is not set"));
  EXPECT_TRUE(f.workers[0]->seen_.empty());
  EXPECT_EQ(f.sequencer->last_seq(), 0u);
  // Nothing was sent, so the next batch goes through as seq 1.
  auto next = f.sequencer->Run(Batch());
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(f.sequencer->last_seq(), 1u);
}

TEST(CommandSequencerTest, KeepsTheDigestABatchCarriesButStillRefusesOneWithoutAKind) {
  Fixture f(2);
  // MakeStepBatch stamps the program's digest; the sequencer sends it as is
  // (a worker recomputes it from the content), so a wrong one reaches them.
  v1::CommandBatch carried = MakeStepBatch({StepCommand::OptimStep()}, 4, true);
  ASSERT_EQ(carried.digest(), ProgramDigest({StepCommand::OptimStep()}, 4, true));
  carried.set_digest("not the content's digest");
  ASSERT_TRUE(f.sequencer->Run(carried).ok());
  EXPECT_EQ(f.workers[0]->seen_.back().digest(), "not the content's digest");
  EXPECT_EQ(f.workers[0]->seen_.back().seq(), 1u);

  v1::CommandBatch kindless;
  kindless.set_digest("a digest of nothing");
  auto results = f.sequencer->Run(kindless);
  ASSERT_FALSE(results.ok());
  EXPECT_EQ(results.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(results.status().message()), HasSubstr("kind is not set"));
  EXPECT_EQ(f.workers[0]->seen_.size(), 1u);
}

TEST(CommandSequencerTest, NamesTheUnreachableRankAbortsTheOthersAndRefusesLaterBatches) {
  Fixture f(4);
  // Rank 2 died: its call breaks and it no longer answers; its peers' Gloo
  // calls failed because of it.
  f.workers[2]->fail_ = absl::UnavailableError("Socket closed");
  f.workers[2]->dead_ = true;
  f.workers[0]->fail_ = absl::UnavailableError("gloo all_gather failed: connection reset");
  auto results = f.sequencer->Run(Batch());
  ASSERT_FALSE(results.ok());
  EXPECT_THAT(std::string(results.status().message()), HasSubstr("rank 2 (fake:2)"));
  EXPECT_THAT(std::string(results.status().message()), HasSubstr("unreachable"));
  EXPECT_EQ(FailedRank(results.status()), 2);
  for (int r : {1, 3}) EXPECT_FALSE(f.workers[static_cast<size_t>(r)]->aborts_.empty()) << r;
  auto later = f.sequencer->Run(Batch());
  EXPECT_FALSE(later.ok());
  EXPECT_EQ(FailedRank(later.status()), 2);
  EXPECT_EQ(f.workers[1]->seen_.size(), 1u) << "nothing is sent after a failure";
  EXPECT_EQ(f.sequencer->last_seq(), 0u);
}

// A rank shut down mid-batch: its server cancels the call as it stops, and
// then it answers nothing. The job was not stopped: the failure is the
// rank's, UNAVAILABLE, not the CANCELLED a stop of the job would be.
TEST(CommandSequencerTest, ARankWhoseCallWasCancelledAndThatNoLongerAnswersIsUnavailable) {
  Fixture f(2);
  f.workers[1]->fail_ = absl::CancelledError("Cancelling all calls");
  f.workers[1]->dead_ = true;
  auto results = f.sequencer->Run(Batch());
  ASSERT_FALSE(results.ok());
  EXPECT_EQ(results.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(results.status().message()),
              HasSubstr("rank 1 (fake:1) is unreachable, its process died or its host is down: "
                        "Cancelling all calls"));
  EXPECT_EQ(FailedRank(results.status()), 1);
}

TEST(CommandSequencerTest, OfSeveralFailingRanksThatAnswerTheFirstToFailIsBlamed) {
  // The fake answers on the calling thread, in rank order: rank 1 first.
  Fixture f(3);
  f.workers[1]->fail_ = absl::InvalidArgumentError("digest mismatch");
  f.workers[2]->fail_ = absl::InvalidArgumentError("digest mismatch");
  auto results = f.sequencer->Run(Batch());
  ASSERT_FALSE(results.ok());
  EXPECT_EQ(results.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(results.status().message()), HasSubstr("rank 1 (fake:1) failed"));
  EXPECT_EQ(FailedRank(results.status()), 1);
}

TEST(CommandSequencerTest, TheRankThatFailedFirstIsBlamedNotTheOnesAbortedForIt) {
  Fixture f(3);
  // Rank 0 waits in a collective for rank 2, whose load fails; aborted, rank
  // 0's collective fails too, after rank 2's failure.
  f.workers[0]->hang_ = true;
  f.workers[0]->fail_when_aborted_ = true;
  f.workers[2]->fail_ = absl::NotFoundError("no such file: model-1-of-2.safetensors");
  auto results = f.sequencer->Run(Batch());
  ASSERT_FALSE(results.ok());
  EXPECT_EQ(results.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(results.status().message()), HasSubstr("rank 2 (fake:2) failed"));
  EXPECT_EQ(FailedRank(results.status()), 2);
}

TEST(CommandSequencerTest, FailCancelsTheBatchInFlight) {
  Fixture f(2);
  f.workers[1]->hang_ = true;
  absl::StatusOr<std::vector<v1::CommandResult>> results;
  std::thread run([&] { results = f.sequencer->Run(Batch()); });
  f.workers[1]->hung_.get_future().wait();
  f.sequencer->Fail(1, absl::UnavailableError("missed heartbeats for 5s"));
  run.join();
  ASSERT_FALSE(results.ok());
  EXPECT_THAT(std::string(results.status().message()),
              HasSubstr("rank 1: missed heartbeats for 5s"));
  EXPECT_EQ(FailedRank(results.status()), 1);
  EXPECT_FALSE(f.workers[0]->aborts_.empty());
}

TEST(CommandSequencerTest, ABatchThatRanOutOfTimeIsNamedButBlamedOnNoRank) {
  Fixture f(2);
  f.workers[0]->fail_ = absl::DeadlineExceededError("Deadline Exceeded");
  f.workers[1]->fail_ = absl::DeadlineExceededError("Deadline Exceeded");
  auto results = f.sequencer->Run(Batch());
  ASSERT_FALSE(results.ok());
  EXPECT_THAT(std::string(results.status().message()), HasSubstr("rank 0 (fake:0) failed"));
  EXPECT_EQ(FailedRank(results.status()), std::nullopt);
}

// Runs a batch on `f`'s sequencer, bounded: a batch still running after
// `within` (a stall that was never noticed) is failed, and so is the test.
absl::StatusOr<std::vector<v1::CommandResult>> RunWithin(Fixture& f, absl::Duration within,
                                                         const std::function<void()>& meanwhile) {
  auto run = std::async(std::launch::async, [&] { return f.sequencer->Run(Batch()); });
  meanwhile();
  if (run.wait_for(absl::ToChronoSeconds(within)) != std::future_status::ready) {
    f.sequencer->Fail(-1, absl::CancelledError("the test gave up"));
    ADD_FAILURE() << "the batch was still running after " << within;
  }
  return run.get();
}

// Ranks 0 and 1 finished; rank 2 still runs the batch and its progress
// counter stays still: failed as stalled once the stall timeout passes, not
// at the batch timeout (10 s here), blamed on it, the others aborted.
TEST(CommandSequencerTest, ARankStillWhileTheOthersFinishedIsFailedAsStalled) {
  Fixture f(3, {absl::Seconds(10), absl::Milliseconds(200)});
  for (auto& w : f.workers) w->hang_ = true;
  const absl::Time start = absl::Now();
  auto results = RunWithin(f, absl::Seconds(5), [&] {
    for (auto& w : f.workers) w->hung_.get_future().wait();
    // Ranks 0 and 1 answer while the sequencer waits: the stall clock starts.
    f.workers[0]->Answer();
    f.workers[1]->Answer();
  });
  ASSERT_FALSE(results.ok());
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  EXPECT_EQ(results.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(FailedRank(results.status()), 2);
  const std::string message(results.status().message());
  EXPECT_THAT(message, HasSubstr("rank 2: its worker (fake:2) made no progress for "));
  EXPECT_THAT(message, HasSubstr("(its progress counter stayed at 7) while 2 of 3 ranks "
                                 "finished step batch 1"));
  EXPECT_THAT(message, HasSubstr("--stall-timeout is 200ms"));
  EXPECT_GE(f.workers[2]->probes_.load(), 2) << "a stall needs two readings a timeout apart";
  EXPECT_EQ(f.workers[0]->probes_.load(), 0) << "a rank that finished is not probed";
  for (int r : {0, 1}) EXPECT_FALSE(f.workers[static_cast<size_t>(r)]->aborts_.empty()) << r;
  auto later = f.sequencer->Run(Batch());
  EXPECT_EQ(FailedRank(later.status()), 2);
}

// A frozen process answers no probe: its counter cannot have moved.
TEST(CommandSequencerTest, ARankThatAnswersNoProbeIsStalledToo) {
  Fixture f(2, {absl::Seconds(10), absl::Milliseconds(200)});
  f.workers[1]->hang_ = true;
  f.workers[1]->dead_ = true;
  auto results = RunWithin(f, absl::Seconds(5), [] {});
  ASSERT_FALSE(results.ok());
  EXPECT_EQ(FailedRank(results.status()), 1);
  EXPECT_THAT(std::string(results.status().message()),
              HasSubstr("(it did not answer its progress probes) while 1 of 2 ranks finished"));
}

// A straggler whose counter moves at every probe is working (a big write):
// it is waited for however long past the stall timeout it takes.
TEST(CommandSequencerTest, AStragglerWhoseCounterMovesIsWaitedFor) {
  Fixture f(2, {absl::Seconds(10), absl::Milliseconds(100)});
  f.workers[1]->hang_ = true;
  f.workers[1]->progressing_ = true;
  // At 10 ms a probe, 60 probes outlast the stall timeout six times over.
  f.workers[1]->answer_at_probe_ = 60;
  auto results = RunWithin(f, absl::Seconds(10), [] {});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(f.workers[1]->probes_.load(), 60);
  EXPECT_TRUE(f.workers[0]->aborts_.empty());
  EXPECT_TRUE(f.sequencer->failure().ok());
}

// The straggler answers while it is being probed, at the very probe that
// finds it still for the timeout (the first probe starts its clock; the
// second, 10 ms on, is past a 10 ms timeout): it finished, so it is not
// failed, and the batch is OK.
TEST(CommandSequencerTest, AStragglerThatAnswersWhileProbedIsNotFailed) {
  Fixture f(2, {absl::Seconds(10), absl::Milliseconds(10)});
  f.workers[1]->hang_ = true;
  f.workers[1]->answer_at_probe_ = 2;
  auto results = RunWithin(f, absl::Seconds(10), [] {});
  ASSERT_TRUE(results.ok()) << results.status();
  EXPECT_EQ(f.workers[1]->probes_.load(), 2);
  EXPECT_TRUE(f.sequencer->failure().ok()) << f.sequencer->failure();
  EXPECT_TRUE(f.workers[0]->aborts_.empty());
}

// The stalled rank's answer slips in after the decision, while its call is
// being cancelled (it reads as success): the batch fails all the same, for
// the stall, since the epoch is failed and its ranks aborted by then.
TEST(CommandSequencerTest, AStalledRankWhoseAnswerSlipsInAtTheCancelStillFailsTheBatch) {
  Fixture f(2, {absl::Seconds(10), absl::Milliseconds(100)});
  f.workers[1]->hang_ = true;
  f.workers[1]->answer_when_cancelled_ = true;
  auto results = RunWithin(f, absl::Seconds(10), [] {});
  ASSERT_FALSE(results.ok()) << "the answer at the cancel passed the stalled batch";
  EXPECT_EQ(results.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(FailedRank(results.status()), 1);
  EXPECT_THAT(std::string(results.status().message()), HasSubstr("made no progress for "));
  EXPECT_FALSE(f.sequencer->failure().ok());
  EXPECT_FALSE(f.workers[0]->aborts_.empty());
}

TEST(StallWatchTest, AClockStartsAtTheFirstReadingAndRestartsWhenTheCounterMoves) {
  const StallWatch::Clock::time_point t0{};
  const auto at = [t0](int seconds) { return t0 + std::chrono::seconds(seconds); };
  StallWatch watch(absl::Seconds(10));
  watch.Observe(1, 5, at(0));
  watch.Observe(2, std::nullopt, at(2));
  EXPECT_FALSE(watch.Stalled(at(9)).has_value());
  // Rank 1 moved at 9 s; an unanswered probe of rank 2 does not restart it.
  watch.Observe(1, 6, at(9));
  watch.Observe(2, std::nullopt, at(9));
  std::optional<StallWatch::Stall> stall = watch.Stalled(at(12));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 2);
  EXPECT_EQ(stall->still_for, absl::Seconds(10));
  EXPECT_EQ(stall->progress, std::nullopt);
  // Both still past the timeout: the one still longest.
  stall = watch.Stalled(at(30));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 2);
  // Rank 2 answered its batch: only rank 1 is left.
  watch.Retain({1});
  stall = watch.Stalled(at(30));
  ASSERT_TRUE(stall.has_value());
  EXPECT_EQ(stall->rank, 1);
  EXPECT_EQ(stall->progress, 6u);
  EXPECT_EQ(stall->still_for, absl::Seconds(21));
  watch.Retain({});
  EXPECT_FALSE(watch.Stalled(at(60)).has_value());
}

TEST(StallWatchTest, ProbesAboutTenTimesPerTimeoutWithinBounds) {
  EXPECT_EQ(StallWatch(absl::Seconds(5)).probe_interval(), absl::Milliseconds(500));
  EXPECT_EQ(StallWatch(absl::Minutes(5)).probe_interval(), absl::Seconds(2));
  EXPECT_EQ(StallWatch(absl::Milliseconds(20)).probe_interval(), absl::Milliseconds(10));
}

TEST(FailedRankTest, TravelsWithTheStatusThroughPrefixesAndIsAbsentOtherwise) {
  const absl::Status blamed = WithFailedRank(absl::NotFoundError("no manifest.json"), 3);
  const absl::Status prefixed = PrefixStatus("checkpoint 'step-2' was not loaded: ", blamed);
  EXPECT_EQ(prefixed.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(prefixed.message(), "checkpoint 'step-2' was not loaded: no manifest.json");
  EXPECT_EQ(FailedRank(prefixed), 3);
  EXPECT_EQ(FailedRank(absl::NotFoundError("no manifest.json")), std::nullopt);
  EXPECT_EQ(FailedRank(WithFailedRank(absl::AbortedError("stopped"), -1)), std::nullopt);
  EXPECT_TRUE(WithFailedRank(absl::OkStatus(), 1).ok());
  EXPECT_EQ(FailedRank(WithFailedRank(absl::OkStatus(), 1)), std::nullopt);
}

}  // namespace
}  // namespace flatshard
