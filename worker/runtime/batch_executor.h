// Runs command batches on a worker strictly in (job_epoch, seq) order (DESIGN.md
// §4's ordering invariant): a batch for another epoch, out of sequence, or whose
// program differs from the one this worker compiles itself from the same inputs
// is refused before any collective is issued, so a confused coordinator cannot
// make ranks issue mismatched collectives and hang. After a batch fails midway
// the executor refuses everything: the job must be re-formed (new epoch).
#ifndef FLATSHARD_WORKER_RUNTIME_BATCH_EXECUTOR_H_
#define FLATSHARD_WORKER_RUNTIME_BATCH_EXECUTOR_H_

#include <cstdint>

#include "absl/status/statusor.h"

#include "flatshard/v1/worker.pb.h"
#include "worker/compute/batch.h"
#include "worker/runtime/fsdp_runtime.h"

namespace flatshard {

class BatchExecutor {
 public:
  // The first batch accepted is seq `last_completed_seq + 1`.
  BatchExecutor(FsdpRuntime* runtime, uint64_t job_epoch, uint64_t last_completed_seq = 0)
      : runtime_(runtime), epoch_(job_epoch), last_seq_(last_completed_seq) {}

  // FAILED_PRECONDITION for a wrong epoch or seq, INVALID_ARGUMENT for a digest
  // or program mismatch; in all three cases nothing ran. Errors while running
  // are returned as they come and poison the executor.
  absl::StatusOr<v1::CommandResult> Execute(const v1::CommandBatch& batch,
                                            const compute::Batch& data);

  // Builds the batch a coordinator would send for the next step (what the
  // standalone harness and tests use).
  v1::CommandBatch MakeBatch(int64_t step, bool sync_gradients) const;

  uint64_t last_completed_seq() const { return last_seq_; }
  uint64_t job_epoch() const { return epoch_; }

 private:
  absl::Status Check(const v1::CommandBatch& batch) const;

  FsdpRuntime* runtime_;
  uint64_t epoch_;
  uint64_t last_seq_;
  absl::Status failure_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_BATCH_EXECUTOR_H_
