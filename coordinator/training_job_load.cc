// TrainingJob's loads (docs/architecture.md §6): staged on every rank, then
// applied; a client's load starts a new checkpoint history
// (docs/fault-tolerance.md, "Restore"), a recovery's stays on its own.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "spdlog/spdlog.h"

#include "coordinator/checkpoint_catalog.h"
#include "coordinator/training_job.h"
#include "core/status_macros.h"
#include "core/status_payloads.h"
#include "storage/checkpoint_manifest.h"

namespace flatshard {

absl::Time TrainingJob::CheckpointClock() const {
  return options_.checkpoint_clock ? options_.checkpoint_clock() : absl::Now();
}

absl::StatusOr<int64_t> TrainingJob::HistoryStart() const {
  // After every save begun so far, whatever the clock did: the history it
  // starts holds none of them (BuildManifest stamps the saves after it no
  // earlier than this).
  int64_t since = absl::ToUnixMicros(CheckpointClock());
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> all, catalog_.List());
  for (const v1::CheckpointInfo& c : all) since = std::max(since, c.created_unix_micros() + 1);
  return since;
}

absl::StatusOr<v1::CheckpointInfo> TrainingJob::LoadCheckpoint(const std::string& name) {
  ASSIGN_OR_RETURN(OperationLock op, BeginOperation("load a checkpoint"));
  RETURN_IF_ERROR(catalog_.Read(name).status());  // a wrong name waits for nothing
  // An async save still committing is of the history this load leaves: it
  // commits (and retires, keep_last) before the load, not after it.
  if (committer_.joinable()) committer_.join();
  return LoadLocked(name, /*starts_history=*/true);
}

absl::StatusOr<v1::CheckpointInfo> TrainingJob::LoadLocked(const std::string& name,
                                                           bool starts_history) {
  ASSIGN_OR_RETURN(CheckpointManifest manifest, catalog_.Read(name));
  // An async save's commit may retire old checkpoints meanwhile: not this one.
  const CheckpointCatalog::Pin pin(&catalog_, manifest.name);
  v1::CheckpointBatch command;
  command.mutable_load_shard()->set_directory(catalog_.RelativeDir(manifest.name));
  // Stage everywhere first: a rank that cannot read its part changes nothing.
  absl::StatusOr<std::vector<v1::CommandResult>> staged = RunCheckpointBatch(command);
  if (!staged.ok()) {
    return PrefixStatus(
        absl::StrCat("checkpoint '", manifest.name, "' was not loaded (the job is unchanged): "),
        staged.status());
  }
  int64_t since = 0;
  if (starts_history) {
    absl::StatusOr<int64_t> start = HistoryStart();
    if (!start.ok()) {
      return PrefixStatus(
          absl::StrCat("checkpoint '", manifest.name, "' was not loaded (the job is unchanged): "),
          start.status());
    }
    since = *start;
  }
  command.mutable_load_shard()->set_apply(true);
  const std::shared_ptr<CommandSequencer> epoch = sequencer();
  absl::StatusOr<std::vector<v1::CommandResult>> applied = RunCheckpointBatch(command);
  if (!applied.ok()) {
    // A batch that failed the epoch was recovered from by RunCheckpointBatch
    // already. One that some ranks applied and another refused (blamed on
    // that rank: RunCheckpointBatch blames one only when another's part
    // succeeded) left the epoch running with its ranks disagreeing: the job
    // must not stay READY on that, so it recovers as from any failed batch
    // (or fails, with no restart left). Refused everywhere, nothing changed.
    // A recovery's own load is the recovery's to retry (OnBatchFailure
    // leaves it alone).
    const bool half_applied = FailedRank(applied.status()).has_value();
    if (half_applied && sequencer() == epoch && epoch->failure().ok()) {
      (void)OnBatchFailure(applied.status());
    }
    return applied.status();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    step_ = manifest.step;
    state_checkpoint_ = manifest.name;  // its apply batch bumped the generation
    // A new history: the newer checkpoints of the one it left are not its.
    if (starts_history) {
      history_ =
          CheckpointHistory{manifest.name, manifest.step, manifest.created_unix_micros, since};
    }
    data_position_ = manifest.data_position;
    unsharded_.clear();
    peer_marks_.clear();  // they describe a history this load left
  }
  Persist();
  spdlog::info("job {}: loaded checkpoint {} (step {})", config_.name, manifest.name,
               manifest.step);
  v1::CheckpointInfo info;
  info.set_name(manifest.name);
  info.set_step(manifest.step);
  info.set_state_dict_type(manifest.state_dict_type);
  info.set_world_size(manifest.world_size);
  info.set_bytes(static_cast<int64_t>(CheckpointBytes(manifest)));
  return info;
}

}  // namespace flatshard
