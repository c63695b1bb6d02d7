// TrainingJob's in-memory peer snapshots (docs/fault-tolerance.md): the batch
// that has every rank take one after a step, and the restore a recovery runs
// instead of loading a checkpoint when the survivors still hold every rank's
// state of a newer step.
#include <utility>

#include "absl/strings/str_cat.h"
#include "rpc/status_proto.h"
#include "spdlog/spdlog.h"

#include "coordinator/training_job.h"
#include "core/status_macros.h"

namespace flatshard {
namespace {

// Marks kept: the workers keep three generations of each kind, so older ones
// cannot be restored anyway.
constexpr size_t kMarksKept = 4;

}  // namespace

absl::Status TrainingJob::MaybeTakePeerSnapshot() {
  const int64_t every = config_.checkpoints.in_memory_every_steps;
  int64_t step = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step = step_;
  }
  if (every <= 0 || step % every != 0) return absl::OkStatus();
  v1::CommandBatch batch;
  batch.mutable_checkpoint()->mutable_take_peer_snapshot()->set_step(step);
  ASSIGN_OR_RETURN(std::vector<v1::CommandResult> results, sequencer()->Run(std::move(batch)));
  for (const v1::CommandResult& r : results) {
    if (absl::Status s = StatusFromProto(r.checkpoint_status()); !s.ok()) {
      // Training goes on; a recovery just cannot use this generation.
      spdlog::warn("job {}: rank {} took no peer snapshot of step {}: {}", config_.name, r.rank(),
                   step, s.ToString());
      return absl::OkStatus();
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  peer_marks_[{epoch_, step}] = PeerSnapshotMark{static_cast<int>(members_.size()), data_position_};
  while (peer_marks_.size() > kMarksKept) peer_marks_.erase(peer_marks_.begin());
  return absl::OkStatus();
}

absl::StatusOr<bool> TrainingJob::RestorePeerSnapshotLocked(const PeerSnapshotChoice& choice) {
  v1::CommandBatch batch;
  v1::CheckpointBatch::RestorePeerSnapshot* restore =
      batch.mutable_checkpoint()->mutable_restore_peer_snapshot();
  restore->set_step(choice.step);
  restore->set_from_epoch(choice.epoch);
  restore->set_from_world_size(choice.from_world_size);
  for (int h : choice.holder) restore->add_holder(h);
  // The job is at the restored step before the batch is sent, for the
  // journal records it with the step and data position it leaves the ranks
  // at (JournalBatch): a coordinator restarted after it re-adopts them there,
  // not at the step the job had failed at. Put back if the restore fails.
  int64_t failed_step = 0;
  int64_t failed_position = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_step = std::exchange(step_, choice.step);
    failed_position = std::exchange(data_position_, choice.data_position);
  }
  const auto put_back = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = failed_step;
    data_position_ = failed_position;
  };
  absl::StatusOr<std::vector<v1::CommandResult>> results = sequencer()->Run(std::move(batch));
  if (!results.ok()) {
    put_back();
    return results.status();
  }
  for (const v1::CommandResult& r : *results) {
    if (absl::Status s = StatusFromProto(r.checkpoint_status()); !s.ok()) {
      spdlog::warn("job {}: the peer snapshots of step {} could not be restored (rank {}: {})",
                   config_.name, choice.step, r.rank(), s.ToString());
      put_back();
      return false;
    }
  }
  std::lock_guard<std::mutex> lock(mu_);
  unsharded_.clear();
  // Generations past the restored one belong to steps the job now runs again.
  std::erase_if(peer_marks_, [&](const auto& mark) { return mark.first.second > choice.step; });
  return true;
}

}  // namespace flatshard
