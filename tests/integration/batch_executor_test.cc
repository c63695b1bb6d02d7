// The ordering invariant (docs/architecture.md §4) between real processes: a batch with the
// wrong epoch, an out-of-order seq or a digest that does not match its program is
// refused before any collective, on every rank, and the job goes on afterwards
// (a refused batch that had issued even one collective would desynchronise the
// next). A rank that refuses while its peer goes ahead makes the peer fail at
// the collective timeout instead of hanging.
#include "worker/runtime/batch_executor.h"

#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>

#include <gtest/gtest.h>

#include "rpc/command_batch.h"
#include "rpc/status_proto.h"

#include "core/model_spec_yaml.h"
#include "storage/checkpoint_manifest.h"
#include "tests/integration/multiprocess.h"
#include "worker/comm/file_store.h"
#include "worker/compute/data_source.h"

namespace flatshard {
namespace {

using testing::AllRanksSucceeded;
using testing::MakeTempDir;
using testing::RunRanks;

constexpr char kModel[] = R"(
root:
  type: Sequential
  children:
    - {name: inp, type: Linear, in_features: 8, out_features: 16}
    - name: blocks
      repeat: 2
      template:
        type: Residual
        children: [{name: fc, type: Linear, in_features: 16, out_features: 16}]
    - {name: out, type: Linear, in_features: 16, out_features: 4}
)";

struct Rank {
  std::unique_ptr<FsdpRuntime> runtime;
  std::unique_ptr<compute::DataSource> data;
};

absl::StatusOr<Rank> Start(const std::string& dir, int rank, int world, absl::Duration timeout) {
  auto spec = ParseModelSpec(kModel, "model.yaml");
  if (!spec.ok()) return spec.status();
  static ModelSpec kept;  // the runtime keeps a reference; one per process
  kept = *spec;
  compute::DataSourceOptions data_options;
  data_options.kind = compute::DataKind::kRegression;
  data_options.global_batch_size = 12;  // divisible by 2 and 3
  data_options.input_features = 8;
  data_options.output_features = 4;
  auto data = compute::MakeDataSource(data_options);
  if (!data.ok()) return data.status();
  RuntimeOptions options;
  options.optimizer.kind = OptimizerKind::kSgd;
  options.optimizer.sgd.lr = 0.01;
  options.gloo.timeout = timeout;
  auto store = FileStore::Open(dir);
  if (!store.ok()) return store.status();
  auto runtime = FsdpRuntime::Create(kept, *ParseWrapPolicy("module-type:Residual"), options, rank,
                                     world, *store);
  if (!runtime.ok()) return runtime.status();
  return Rank{*std::move(runtime), *std::move(data)};
}

int RefusalsBody(const std::string& dir, int rank, int world) {
  auto started = Start(dir, rank, world, absl::Seconds(60));
  if (!started.ok()) {
    std::cerr << started.status() << "\n";
    return 1;
  }
  BatchExecutor executor(started->runtime.get(), /*job_epoch=*/7);
  auto data = started->data->GetBatch(0, rank, world);
  CHILD_CHECK(data.ok());

  v1::CommandBatch good = executor.MakeBatch(0, true);
  CHILD_CHECK(good.seq() == 1);

  v1::CommandBatch wrong_epoch = good;
  wrong_epoch.set_job_epoch(6);
  auto r = executor.Execute(wrong_epoch, *data);
  CHILD_CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
  CHILD_CHECK(std::string(r.status().message()).find("job epoch 6, this worker is in epoch 7") !=
              std::string::npos);

  v1::CommandBatch out_of_order = good;
  out_of_order.set_seq(3);
  r = executor.Execute(out_of_order, *data);
  CHILD_CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
  CHILD_CHECK(std::string(r.status().message()).find("out of order, expected seq 1") !=
              std::string::npos);

  v1::CommandBatch tampered = good;  // a command changed, digest kept
  tampered.mutable_step()->mutable_commands(1)->mutable_unshard()->set_unit(2);
  r = executor.Execute(tampered, *data);
  CHILD_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHILD_CHECK(std::string(r.status().message()).find("digest mismatch") != std::string::npos);

  v1::CommandBatch foreign = good;  // consistent digest, but not this job's program
  foreign.mutable_step()->mutable_commands()->RemoveLast();
  foreign.set_digest(*BatchDigest(foreign));
  r = executor.Execute(foreign, *data);
  CHILD_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHILD_CHECK(std::string(r.status().message()).find("differs from the one this worker compiles") !=
              std::string::npos);
  v1::CommandBatch malformed = good;  // a negative unit: refused naming the field
  malformed.mutable_step()->mutable_commands(1)->mutable_unshard()->set_unit(-1);
  r = executor.Execute(malformed, *data);
  CHILD_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHILD_CHECK(
      std::string(r.status().message()).find("step.commands[1].unshard.unit must be >= 0") !=
      std::string::npos);

  v1::CommandBatch kindless = good;  // no kind: nothing says what it is
  kindless.clear_kind();
  r = executor.Execute(kindless, *data);
  CHILD_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHILD_CHECK(std::string(r.status().message()).find("kind is not set") != std::string::npos);

  // A well-formed batch of another kind is not run as a step.
  v1::CommandBatch control = MakeControlBatch({StepCommand::Reshard(0)});
  control.set_job_epoch(good.job_epoch());
  control.set_seq(good.seq());
  control.set_digest(*BatchDigest(control));
  r = executor.Execute(control, *data);
  CHILD_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
  CHILD_CHECK(std::string(r.status().message()).find("it is a control batch, not a step batch") !=
              std::string::npos);
  CHILD_CHECK(executor.last_completed_seq() == 0);
  CHILD_CHECK(started->runtime->memory().peak(MemoryKind::kUnshardedParams) == 0);

  // A malformed peer-snapshot restore is refused before it runs (a holder
  // outside the world), so it does not poison the executor either.
  v1::CommandBatch restore;
  v1::CheckpointBatch::RestorePeerSnapshot* request =
      restore.mutable_checkpoint()->mutable_restore_peer_snapshot();
  request->set_from_world_size(2);
  request->add_holder(0);
  request->add_holder(world + 3);
  restore.set_job_epoch(good.job_epoch());
  restore.set_seq(good.seq());
  restore.set_digest(*BatchDigest(restore));
  auto refused = executor.ExecutePeerSnapshot(
      restore, [](v1::CommandResult&) { return absl::InternalError("must not run"); });
  CHILD_CHECK(refused.status().code() == absl::StatusCode::kInvalidArgument);
  CHILD_CHECK(std::string(refused.status().message()).find("is outside a world of size") !=
              std::string::npos);

  // Nothing ran, so the ranks are still in step: the real batches go through.
  for (int64_t step = 0; step < 3; ++step) {
    auto batch = started->data->GetBatch(step, rank, world);
    CHILD_CHECK(batch.ok());
    auto result = executor.Execute(executor.MakeBatch(step, true), *batch);
    if (!result.ok()) {
      std::cerr << result.status() << "\n";
      return 1;
    }
    CHILD_CHECK(result->seq() == static_cast<uint64_t>(step + 1));
    CHILD_CHECK(std::isfinite(result->loss()));
  }
  // A replayed seq is refused too.
  r = executor.Execute(good, *data);
  CHILD_CHECK(r.status().code() == absl::StatusCode::kFailedPrecondition);
  return 0;
}

TEST(BatchExecutorTest, RefusesBadBatchesBeforeAnyCollectiveOnEveryRank) {
  const std::string dir = MakeTempDir("executor");
  auto results = RunRanks(
      3, [&](int rank) { return RefusalsBody(dir, rank, 3); }, absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// Rank 1 gets a corrupted batch and refuses; rank 0 runs the real one. Rank 0
// must fail at the collective timeout with an error, not hang.
TEST(BatchExecutorTest, PeerRefusalTimesOutInsteadOfHanging) {
  const std::string dir = MakeTempDir("executor-split");
  auto results = RunRanks(
      2,
      [&](int rank) {
        auto started = Start(dir, rank, 2, absl::Seconds(3));
        if (!started.ok()) {
          std::cerr << "rank " << rank << " start: " << started.status() << "\n";
          return 1;
        }
        BatchExecutor executor(started->runtime.get(), 1);
        auto data = started->data->GetBatch(0, rank, 2);
        v1::CommandBatch batch = executor.MakeBatch(0, true);
        if (rank == 1) batch.set_digest("corrupted");
        auto result = executor.Execute(batch, *data);
        if (rank == 1) return result.status().code() == absl::StatusCode::kInvalidArgument ? 0 : 2;
        if (result.ok()) return 3;
        std::cerr << "rank 0 failed as expected: " << result.status() << "\n";
        // The executor is poisoned after a failure midway.
        auto again = executor.Execute(executor.MakeBatch(0, true), *data);
        return std::string(again.status().message()).find("re-form the job") != std::string::npos
                   ? 0
                   : 4;
      },
      absl::Seconds(60));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// A synchronous SHARDED save of epoch 1 into `directory`, stamped as the
// coordinator would.
v1::CommandBatch SaveBatch(const std::string& directory, uint64_t seq) {
  v1::CommandBatch batch;
  v1::CheckpointBatch::SaveShard& save = *batch.mutable_checkpoint()->mutable_save_shard();
  save.set_directory(directory);
  save.mutable_settings()->set_state_dict_type(v1::SHARDED_STATE_DICT);
  batch.set_job_epoch(1);
  batch.set_seq(seq);
  batch.set_digest(*BatchDigest(batch));
  return batch;
}

// A save batch writes only into the directory the coordinator made when it
// began the save. A rank that gets the batch after the coordinator abandoned
// the save (another rank failed; the directory is gone) fails its write
// naming the directory and does not make it again: the abandoned save leaves
// nothing behind. The save that has its directory writes every rank's file.
TEST(BatchExecutorTest, ASaveIntoAnAbandonedDirectoryFailsAndLeavesNothing) {
  const std::string dir = MakeTempDir("executor-save");
  const std::string root = dir + "/checkpoints";
  std::filesystem::create_directories(root + "/job/kept.partial");
  std::ofstream(root + "/job/file.partial") << "not a directory";
  auto results = RunRanks(
      2,
      [&](int rank) {
        auto started = Start(dir + "/store", rank, 2, absl::Seconds(60));
        if (!started.ok()) {
          std::cerr << "rank " << rank << " start: " << started.status() << "\n";
          return 1;
        }
        BatchExecutor executor(started->runtime.get(), 1);
        uint64_t seq = 0;
        auto save = [&](const std::string& directory) {
          std::optional<ShardSnapshot> snapshot;
          return executor.ExecuteCheckpoint(SaveBatch(directory, ++seq), root, &snapshot);
        };
        auto abandoned = save("job/gone.partial");
        CHILD_CHECK(abandoned.ok());  // the batch ran; its write failed
        const absl::Status write = StatusFromProto(abandoned->checkpoint_status());
        CHILD_CHECK(write.code() == absl::StatusCode::kFailedPrecondition);
        CHILD_CHECK(std::string(write.message()).find("job/gone.partial is not there") !=
                    std::string::npos);
        CHILD_CHECK(abandoned->files_size() == 0);
        CHILD_CHECK(!std::filesystem::exists(root + "/job/gone.partial"));
        // A path that is there but not a directory says so.
        auto not_dir = save("job/file.partial");
        CHILD_CHECK(not_dir.ok());
        CHILD_CHECK(std::string(StatusFromProto(not_dir->checkpoint_status()).message())
                        .find("job/file.partial is not a directory") != std::string::npos);
        // The executor is not poisoned: the next save writes this rank's file.
        auto kept = save("job/kept.partial");
        CHILD_CHECK(kept.ok());
        CHILD_CHECK(StatusFromProto(kept->checkpoint_status()).ok());
        CHILD_CHECK(kept->files_size() == 2);  // the model's and the optimizer's shard
        for (const v1::CheckpointFileInfo& file : kept->files()) {
          CHILD_CHECK(std::filesystem::exists(root + "/job/kept.partial/" + file.name()));
        }
        return 0;
      },
      absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

// A synchronous save has no collective for an abort to fail, so it asks
// the runtime between units: a save batch on an aborted runtime fails
// ABORTED before its first unit and leaves no file (and a load's stage fails
// ABORTED before it reads), instead of writing the
// whole shard first (the worker's abort watchdog counts on an aborted batch
// letting go within one unit's I/O).
TEST(BatchExecutorTest, CheckpointBatchesOnAnAbortedRuntimeStopBeforeTheirFirstUnit) {
  const std::string dir = MakeTempDir("executor-abort");
  const std::string root = dir + "/checkpoints";
  std::filesystem::create_directories(root + "/job/aborted.partial");
  auto results = RunRanks(
      2,
      [&](int rank) {
        auto started = Start(dir + "/store", rank, 2, absl::Seconds(60));
        if (!started.ok()) {
          std::cerr << "rank " << rank << " start: " << started.status() << "\n";
          return 1;
        }
        BatchExecutor executor(started->runtime.get(), 1);
        started->runtime->Abort("the test aborts it");
        std::optional<ShardSnapshot> snapshot;
        auto saved =
            executor.ExecuteCheckpoint(SaveBatch("job/aborted.partial", 1), root, &snapshot);
        CHILD_CHECK(!saved.ok());
        CHILD_CHECK(saved.status().code() == absl::StatusCode::kAborted);
        CHILD_CHECK(std::string(saved.status().message()).find("the save was aborted after 0 of") !=
                    std::string::npos);
        // A load's stage likewise, and as the batch's failure: as the
        // checkpoint's status the coordinator would blame this rank for
        // not reading the checkpoint.
        v1::CommandBatch load;
        load.mutable_checkpoint()->mutable_load_shard()->set_directory("job/aborted.partial");
        load.set_job_epoch(1);
        load.set_seq(1);
        load.set_digest(*BatchDigest(load));
        BatchExecutor fresh(started->runtime.get(), 1);  // the first is poisoned by the save
        auto staged = fresh.ExecuteCheckpoint(load, root, &snapshot);
        CHILD_CHECK(!staged.ok());
        CHILD_CHECK(staged.status().code() == absl::StatusCode::kAborted);
        CHILD_CHECK(std::string(staged.status().message()).find("the load was aborted") !=
                    std::string::npos);
        // Its own files only: the other rank may be between making and
        // removing its own.
        for (const char* kind : {"model", "optim"}) {
          const std::string mine = root + "/job/aborted.partial/" + RankFileName(kind, rank, 2);
          if (std::filesystem::exists(mine)) {
            std::cerr << "rank " << rank << " left " << mine << "\n";
            return 1;
          }
        }
        return 0;
      },
      absl::Seconds(120));
  EXPECT_TRUE(AllRanksSucceeded(results));
}

}  // namespace
}  // namespace flatshard
