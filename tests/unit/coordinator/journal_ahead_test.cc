// Tests the batch journal written ahead (TrainingJob::JournalAhead): with a
// state store, a training step's batch is journaled while the batch before
// it runs, and its record is what the write-ahead journal would have held,
// so a restarted coordinator that finds the ranks one seq short of it
// re-adopts them after the batch they ran (coordinator/readoption.h). In-process
// workers, a real SQLite state store; a failed batch shows what the store held
// while it ran, for the job fails for good (max_restarts 0) and no later
// batch is journaled. Kill -9 of a real coordinator mid-training:
// tests/integration/coordinator_restart_test.cc.
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/readoption.h"
#include "coordinator/state_store.h"
#include "coordinator/training_job.h"
#include "core/job_config.h"
#include "storage/spec_files.h"
#include "tests/unit/coordinator/unused_worker_client.h"

namespace flatshard {
namespace {

// Runs every batch at once, except the `fail_at`-th step batch it is sent
// (1-based), which fails; each batch's seq is kept, with what the store's
// journal held as the batch reached this worker.
class StepWorker : public testing::UnusedWorkerClient {
 public:
  StepWorker(int rank, int fail_at, StateStore* store, std::vector<uint64_t>* journaled_at_send)
      : rank_(rank), fail_at_(fail_at), store_(store), journaled_at_send_(journaled_at_send) {}

  void ConfigureAsync(v1::ConfigureRequest, absl::Time, absl::Time, ConfigureDone done) override {
    done(absl::OkStatus());
  }
  void Execute(const v1::CommandBatch* batch, absl::Time, ExecuteDone done) override {
    if (rank_ == 0 && journaled_at_send_ != nullptr) {
      absl::StatusOr<std::optional<BatchRecord>> last = store_->LoadLastBatch("journal-ahead");
      journaled_at_send_->push_back(last.ok() && last->has_value() ? (*last)->batch.seq() : 0);
    }
    if (batch->has_step() && ++steps_ == fail_at_) {
      done(absl::InternalError("the test fails this step"));
      return;
    }
    v1::CommandResult result;
    result.set_seq(batch->seq());
    result.set_rank(rank_);
    done(result);
  }
  void GetStatusAsync(absl::Time, GetStatusDone done) override { done(v1::GetStatusResponse()); }
  void AbortAsync(uint64_t, const std::string&, absl::Time, AbortDone done) override {
    done(absl::OkStatus());
  }
  void Disconnect() override {}
  std::string address() const override { return "step-worker:" + std::to_string(rank_); }

 private:
  int rank_;
  int fail_at_;
  int steps_ = 0;
  StateStore* store_;
  std::vector<uint64_t>* journaled_at_send_;
};

WorkerRecord Worker(int rank) {
  WorkerRecord w;
  w.worker_id = "w" + std::to_string(rank);
  w.address = w.worker_id + ":1";
  w.device = "cpu";
  w.rank = rank;
  return w;
}

struct Outcome {
  std::optional<BatchRecord> last;  // the store's journal once the job failed
  std::vector<uint64_t> seqs_sent;  // step batches' seqs, in order
  std::vector<uint64_t> journaled;  // the journal's seq as each batch reached rank 0
  uint64_t epoch = 0;
};

// Trains 5 steps of `micro_steps` no_sync micro-batches and a synced one at
// W=2; the `fail_at`-th step batch fails on rank 1.
Outcome TrainUntilABatchFails(int micro_steps, int fail_at, bool journal_ahead) {
  Outcome outcome;
  auto spec = LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  spec->set_name("journal-ahead");
  spec->set_world_size(2);
  spec->mutable_recovery()->set_max_restarts(0);
  auto config = JobConfigFromProto(*spec);
  EXPECT_TRUE(config.ok()) << config.status();
  // Each run its own state dir (the directory is this test run's own).
  static int runs = 0;
  const std::string dir = ::testing::TempDir() + "/journal-ahead-" + std::to_string(++runs);
  auto store = StateStore::Open(dir + "/state");
  EXPECT_TRUE(store.ok()) << store.status();
  std::vector<uint64_t> journaled;
  TrainingJobOptions options;
  options.checkpoint_root = dir + "/checkpoints";
  options.state = store->get();
  options.journal_ahead = journal_ahead;
  options.connect = [&](const WorkerRecord& w, size_t) -> std::unique_ptr<WorkerClient> {
    return std::make_unique<StepWorker>(w.rank, w.rank == 1 ? fail_at : 0, store->get(),
                                        &journaled);
  };
  auto job = TrainingJob::Create(*spec, *std::move(config), std::move(options));
  EXPECT_TRUE(job.ok()) << job.status();
  EXPECT_TRUE((*job)->Form({Worker(0), Worker(1)}).ok());
  const size_t formed = journaled.size();
  const absl::Status trained =
      (*job)->Train(5, micro_steps, [](const v1::StepResult&) { return true; });
  EXPECT_FALSE(trained.ok());
  EXPECT_EQ((*job)->states().state(), v1::FAILED);
  journaled.erase(journaled.begin(), journaled.begin() + static_cast<std::ptrdiff_t>(formed));
  outcome.journaled = journaled;
  auto last = (*store)->LoadLastBatch("journal-ahead");
  EXPECT_TRUE(last.ok()) << last.status();
  if (last.ok()) outcome.last = *last;
  if (outcome.last.has_value()) outcome.epoch = outcome.last->batch.job_epoch();
  return outcome;
}

JobRecord RecordAt(uint64_t epoch, int64_t step, int64_t data_position) {
  JobRecord record;
  record.epoch = epoch;
  record.step = step;
  record.data_position = data_position;
  return record;
}

// The third step (seq s) fails: its successor (seq s + 1, data position 3,
// step 4 once run) was journaled while it ran. Ranks that had finished s are
// one seq short of the journal: re-adopted at step 3, data position 3.
TEST(JournalAheadTest, AStepIsJournaledWhileTheStepBeforeItRuns) {
  const Outcome ahead = TrainUntilABatchFails(/*micro_steps=*/0, /*fail_at=*/3, true);
  ASSERT_TRUE(ahead.last.has_value());
  const BatchRecord& last = *ahead.last;
  // Each batch still reached the ranks with itself journaled, never later.
  ASSERT_EQ(ahead.journaled.size(), 3u);
  const uint64_t failed_seq = last.batch.seq() - 1;
  EXPECT_THAT(ahead.journaled, ::testing::ElementsAre(failed_seq - 2, failed_seq - 1, failed_seq));
  ASSERT_TRUE(last.batch.has_step());
  EXPECT_EQ(last.batch.step().step(), 3);  // the data position it reads
  EXPECT_TRUE(last.batch.step().sync_gradients());
  EXPECT_FALSE(last.batch.digest().empty());
  EXPECT_EQ(last.step_after, 4);
  EXPECT_EQ(last.data_position_after, 4);
  EXPECT_FALSE(last.mid_step_before);
  EXPECT_TRUE(last.written_ahead);
  EXPECT_FALSE(last.previous_mid_step_before);

  const JobRecord before = RecordAt(ahead.epoch, 2, 2);
  absl::StatusOr<ReadoptionPoint> ran_nowhere = ReadoptionPointAt(before, last, failed_seq);
  ASSERT_TRUE(ran_nowhere.ok()) << ran_nowhere.status();
  EXPECT_EQ(ran_nowhere->step, 3);
  EXPECT_EQ(ran_nowhere->data_position, 3);
  // The coordinator died sending the failed step: no rank has it either.
  absl::StatusOr<ReadoptionPoint> sent_nowhere = ReadoptionPointAt(before, last, failed_seq - 1);
  ASSERT_TRUE(sent_nowhere.ok()) << sent_nowhere.status();
  EXPECT_EQ(sent_nowhere->step, 2);
  EXPECT_EQ(sent_nowhere->data_position, 2);
  // Further back, no journal explains it.
  EXPECT_EQ(ReadoptionPointAt(before, last, failed_seq - 2).status().code(),
            absl::StatusCode::kFailedPrecondition);

  // Journaled on its path instead, the store holds the failed batch itself.
  const Outcome on_path = TrainUntilABatchFails(0, 3, false);
  ASSERT_TRUE(on_path.last.has_value());
  EXPECT_EQ(on_path.last->batch.seq(), failed_seq);
  EXPECT_EQ(on_path.last->step_after, 3);
  EXPECT_EQ(on_path.last->data_position_after, 3);
  EXPECT_FALSE(on_path.last->written_ahead);
  EXPECT_EQ(on_path.journaled, ahead.journaled);
  // Written before its send, the failed step's record says nothing of the
  // step before it: ranks two seqs short are not re-adopted.
  EXPECT_EQ(ReadoptionPointAt(before, on_path.last, failed_seq - 2).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// With a no_sync micro-batch before each synced one: the micro-batch of step
// 2 (its 3rd batch) fails while its synced batch is journaled, which ranks
// between the two must not be re-adopted at (they hold a gradient a
// restarted step would add to again); the synced batch of step 2 (the 4th)
// fails while step 3's micro-batch is journaled, a step boundary.
TEST(JournalAheadTest, AMicroBatchsSuccessorIsJournaledAsSentMidStep) {
  const Outcome mid = TrainUntilABatchFails(/*micro_steps=*/1, /*fail_at=*/3, true);
  ASSERT_TRUE(mid.last.has_value());
  EXPECT_TRUE(mid.last->batch.step().sync_gradients());
  EXPECT_EQ(mid.last->batch.step().step(), 3);
  EXPECT_EQ(mid.last->step_after, 2);
  EXPECT_EQ(mid.last->data_position_after, 4);
  EXPECT_TRUE(mid.last->mid_step_before);
  EXPECT_FALSE(mid.last->previous_mid_step_before);  // the failed micro-batch began step 2
  const absl::StatusOr<ReadoptionPoint> between =
      ReadoptionPointAt(RecordAt(mid.epoch, 1, 2), mid.last, mid.last->batch.seq() - 1);
  EXPECT_EQ(between.status().code(), absl::StatusCode::kFailedPrecondition) << between.status();
  // Had the micro-batch reached no rank, they would be after step 1.
  const absl::StatusOr<ReadoptionPoint> after_step_1 =
      ReadoptionPointAt(RecordAt(mid.epoch, 1, 2), mid.last, mid.last->batch.seq() - 2);
  ASSERT_TRUE(after_step_1.ok()) << after_step_1.status();
  EXPECT_EQ(after_step_1->step, 1);
  EXPECT_EQ(after_step_1->data_position, 2);

  const Outcome boundary = TrainUntilABatchFails(1, 4, true);
  ASSERT_TRUE(boundary.last.has_value());
  EXPECT_FALSE(boundary.last->batch.step().sync_gradients());
  EXPECT_EQ(boundary.last->batch.step().step(), 4);
  EXPECT_EQ(boundary.last->step_after, 2);
  EXPECT_EQ(boundary.last->data_position_after, 5);
  EXPECT_FALSE(boundary.last->mid_step_before);
  EXPECT_TRUE(boundary.last->previous_mid_step_before);  // the failed synced batch's
  // Had the synced batch reached no rank, they would be mid-step.
  EXPECT_EQ(ReadoptionPointAt(RecordAt(boundary.epoch, 1, 3), boundary.last,
                              boundary.last->batch.seq() - 2)
                .status()
                .code(),
            absl::StatusCode::kFailedPrecondition);
  const absl::StatusOr<ReadoptionPoint> after_step_2 = ReadoptionPointAt(
      RecordAt(boundary.epoch, 1, 3), boundary.last, boundary.last->batch.seq() - 1);
  ASSERT_TRUE(after_step_2.ok()) << after_step_2.status();
  EXPECT_EQ(after_step_2->step, 2);
  EXPECT_EQ(after_step_2->data_position, 4);
}

}  // namespace
}  // namespace flatshard
