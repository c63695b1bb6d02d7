#include "coordinator/readoption.h"

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

constexpr char kMidStep[] =
    "the ranks are between the no_sync micro-batches of a step: they hold gradients a restarted "
    "step would add to again";

}  // namespace

absl::StatusOr<ReadoptionPoint> ReadoptionPointAt(const JobRecord& record,
                                                  const std::optional<BatchRecord>& last,
                                                  uint64_t agreed) {
  ReadoptionPoint point{record.step, record.data_position, agreed};
  if (!last.has_value() || last->batch.job_epoch() != record.epoch) {
    // No batch of this epoch was journaled: the record is where they are.
    if (agreed != record.last_seq) {
      return absl::FailedPreconditionError(
          "the ranks are at another seq than the coordinator recorded");
    }
    return point;
  }
  const v1::CommandBatch& batch = last->batch;
  const bool micro = batch.has_step() && !batch.step().sync_gradients();
  if (agreed == batch.seq()) {
    // It ran everywhere.
    if (batch.has_checkpoint() && batch.checkpoint().has_load_shard()) {
      // A load moves the job to a step the journal does not know.
      return absl::FailedPreconditionError("the last batch loaded a checkpoint");
    }
    // A restore from peer snapshots is journaled at the step it moves the
    // ranks to. One that failed changed nothing on the ranks; the recovery
    // then went on from initialization, which the record holds, not the
    // journal.
    if (batch.has_checkpoint() && batch.checkpoint().has_restore_peer_snapshot() &&
        (record.step != last->step_after || record.data_position != last->data_position_after)) {
      return absl::FailedPreconditionError(
          "the last batch restored peer snapshots, and the job did not go on from them");
    }
    if (micro) {
      return absl::FailedPreconditionError(kMidStep);
    }
    point.step = last->step_after;
    point.data_position = last->data_position_after;
    return point;
  }
  if (agreed + 1 == batch.seq()) {
    // It ran nowhere: the state before it, which the journal recorded.
    if (last->mid_step_before) {
      return absl::FailedPreconditionError(kMidStep);
    }
    point.step = last->step_after - (batch.has_step() && batch.step().sync_gradients() ? 1 : 0);
    point.data_position = last->data_position_after - (batch.has_step() ? 1 : 0);
    return point;
  }
  if (last->written_ahead && agreed + 2 == batch.seq()) {
    // Journaled while the step batch before it ran, which then reached no
    // rank (the coordinator died sending it): the state before that one. It
    // was a synced step batch exactly when this one was not sent mid-step.
    if (last->previous_mid_step_before) {
      return absl::FailedPreconditionError(kMidStep);
    }
    const int previous_sync = last->mid_step_before ? 0 : 1;
    point.step = last->step_after - (batch.step().sync_gradients() ? 1 : 0) - previous_sync;
    point.data_position = last->data_position_after - 2;
    return point;
  }
  return absl::FailedPreconditionError(
      "the ranks are at another seq than the coordinator's last batch");
}

}  // namespace flatshard
