// Runs command batches on a worker strictly in (job_epoch, seq) order (docs/architecture.md
// §4's ordering invariant): a batch for another epoch, out of sequence, or whose
// program differs from the one this worker compiles itself from the same inputs
// is refused before any collective is issued, so a confused coordinator cannot
// make ranks issue mismatched collectives and hang. After a batch fails midway
// the executor refuses everything: the job must be re-formed (new epoch).
#ifndef FLATSHARD_WORKER_RUNTIME_BATCH_EXECUTOR_H_
#define FLATSHARD_WORKER_RUNTIME_BATCH_EXECUTOR_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"

#include "flatshard/v1/worker.pb.h"
#include "worker/compute/batch.h"
#include "worker/runtime/fsdp_runtime.h"
#include "worker/runtime/shard_checkpoint.h"

namespace flatshard {

class BatchExecutor {
 public:
  // The first batch accepted is seq `last_completed_seq + 1`.
  BatchExecutor(FsdpRuntime* runtime, uint64_t job_epoch, uint64_t last_completed_seq = 0)
      : runtime_(runtime), epoch_(job_epoch), last_seq_(last_completed_seq) {}

  // A step batch (`kind` = step). FAILED_PRECONDITION for a wrong epoch or
  // seq, INVALID_ARGUMENT for malformed commands, another kind, or a digest or
  // program mismatch; in all these cases nothing ran. Errors while running
  // are returned as they come and poison the executor.
  absl::StatusOr<v1::CommandResult> Execute(const v1::CommandBatch& batch,
                                            const compute::Batch& data);

  // A control batch: manual Unshard / Reshard / Barrier ops outside a step,
  // under the same epoch, seq and digest checks.
  absl::Status ExecuteControl(const v1::CommandBatch& batch);

  // A summon batch: gathers every parameter (a collective) and hands them to
  // `body` (rank 0 only; other ranks get nothing and free at once).
  absl::Status ExecuteSummon(const v1::CommandBatch& batch,
                             const std::function<absl::Status(SummonedParams&)>& body);

  // A checkpoint batch (one SaveShard or LoadShard), its directory relative
  // to `checkpoint_root`. A file this rank cannot write or read is reported
  // in the result's checkpoint_status, not as a failed batch: every rank
  // took part in the same collectives, so the job goes on and only the
  // checkpoint fails. A failed collective poisons the executor as usual.
  // An async SaveShard returns once the snapshot is taken: it is moved into
  // `*snapshot` for the caller to write in the background.
  absl::StatusOr<v1::CommandResult> ExecuteCheckpoint(const v1::CommandBatch& batch,
                                                      const std::string& checkpoint_root,
                                                      std::optional<ShardSnapshot>* snapshot);

  // A checkpoint batch taking or restoring in-memory peer snapshots: checked
  // like every batch, then `body` runs it (the worker service holds the
  // snapshots). Its non-OK status is a failed batch; `body` reports data
  // problems in the result's checkpoint_status instead.
  absl::StatusOr<v1::CommandResult> ExecutePeerSnapshot(
      const v1::CommandBatch& batch, const std::function<absl::Status(v1::CommandResult&)>& body);

  // Builds the batch a coordinator would send for the next step (what the
  // standalone harness and tests use).
  v1::CommandBatch MakeBatch(int64_t step, bool sync_gradients) const;

  uint64_t last_completed_seq() const { return last_seq_; }
  // A batch failed while running: the job must be re-formed. A batch refused
  // by the checks (nothing ran) does not poison the executor.
  bool poisoned() const { return !failure_.ok(); }
  uint64_t job_epoch() const { return epoch_; }

 private:
  // Poisoning, epoch, seq, digest and kind: what every batch must pass.
  absl::Status CheckBatch(const v1::CommandBatch& batch, v1::CommandBatch::KindCase expected) const;
  // Runs `run` for an accepted batch: success advances the seq, failure
  // poisons the executor.
  absl::Status Run(const v1::CommandBatch& batch, const std::function<absl::Status()>& run);

  FsdpRuntime* runtime_;
  uint64_t epoch_;
  uint64_t last_seq_;
  absl::Status failure_;
  std::optional<StagedCheckpoint> staged_;  // LoadShard stage, awaiting apply
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_BATCH_EXECUTOR_H_
