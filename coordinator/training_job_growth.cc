// TrainingJob growing back to its configured world size after a recovery
// shrank it (docs/fault-tolerance.md): at a scheduled checkpoint that is the
// ranks' state, heartbeating workers outside the epoch join, a new epoch is
// formed, and that checkpoint is loaded into the grown world, so no step is
// lost. A worker that fails to join is passed over until it registers again
// (RefuseJoiner, here; a recovery's spares are passed over the same way).
// Runs with the operation slot held, as a recovery does.
#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "coordinator/training_job.h"
#include "core/status_macros.h"

namespace flatshard {

void TrainingJob::RefuseJoiner(const WorkerRecord& worker, absl::string_view why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    refused_joiners_[worker.worker_id] = worker.session;
  }
  spdlog::warn(
      "job {}: worker {} is passed over for this job until it registers again (its daemon "
      "restarted): it failed to join: {}",
      config_.name, worker.worker_id, std::string(why));
}

bool TrainingJob::RefusedToJoin(const WorkerRecord& worker) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = refused_joiners_.find(worker.worker_id);
  return it != refused_joiners_.end() && it->second == worker.session;
}

absl::Status TrainingJob::MaybeGrow() {
  const int world = world_size();
  if (world >= config_.world_size) return absl::OkStatus();
  int64_t step = 0;
  std::vector<WorkerRecord> members;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step = step_;
    members = members_;
  }
  // Only at a scheduled checkpoint that is the ranks' state: growing loses
  // no step. (A checkpoint of this step number is not enough: a job that
  // loaded an older one and trained back to this step holds another state.)
  int64_t every = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    every = spec_.checkpoints().every_steps();
  }
  if (every <= 0 || step % every != 0) return absl::OkStatus();
  if (committer_.joinable()) committer_.join();  // an async save committing it
  const std::optional<v1::CheckpointInfo> newest = RecoveryCheckpoint(config_.world_size);
  if (!newest.has_value()) return absl::OkStatus();
  const std::string* checkpoint = &newest->name();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (state_checkpoint_ != *checkpoint) return absl::OkStatus();
  }
  absl::StatusOr<CheckpointManifest> manifest = catalog_.Read(*checkpoint);
  if (!manifest.ok() || manifest->step != step) return absl::OkStatus();
  // Workers outside the epoch, heartbeating, on the same kind of device.
  std::set<std::string> in_epoch;
  for (const WorkerRecord& m : members) in_epoch.insert(m.worker_id);
  std::vector<WorkerRecord> joining;
  if (options_.live_workers) {
    for (const WorkerRecord& w : options_.live_workers()) {
      if (in_epoch.contains(w.worker_id) || (!members.empty() && w.device != members[0].device)) {
        continue;
      }
      if (RefusedToJoin(w)) continue;
      if (static_cast<int>(members.size() + joining.size()) < config_.world_size) {
        joining.push_back(w);
      }
    }
  }
  if (static_cast<int>(members.size() + joining.size()) < config_.world_size) {
    return absl::OkStatus();
  }
  const absl::Time began = absl::Now();
  std::vector<std::string> names;
  names.reserve(joining.size());
  for (const WorkerRecord& w : joining) names.push_back(w.worker_id);
  members.insert(members.end(), joining.begin(), joining.end());
  RETURN_IF_ERROR(states_.Transition(
      v1::RECOVERING,
      absl::StrCat("growing back from world size ", world, " to ", config_.world_size, " (",
                   absl::StrJoin(names, ", "), " joined) at checkpoint ", *checkpoint)));
  v1::JobSpec spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spec = spec_;
  }
  spec.clear_rank_by_worker_id();
  absl::Status grown;
  std::vector<std::string> blamed;
  {
    // Like a recovery's own load: a batch that fails in it is recovered from
    // once, below, not also by the batch's caller (RunCheckpointBatch).
    {
      std::lock_guard<std::mutex> lock(mu_);
      recovering_ = true;
    }
    grown = FormLocked(members, spec, std::make_shared<const JobConfig>(config_), &blamed);
    if (grown.ok()) {
      grown = LoadLocked(*checkpoint, /*starts_history=*/false).status();
      if (!grown.ok()) blamed = {BlamedMember(grown)};
    }
    std::lock_guard<std::mutex> lock(mu_);
    recovering_ = false;
  }
  for (const WorkerRecord& w : joining) {
    if (!grown.ok() && std::find(blamed.begin(), blamed.end(), w.worker_id) != blamed.end()) {
      RefuseJoiner(w, grown.message());
    }
  }
  if (!grown.ok()) {
    // A joining worker failed: recover as from any failure (it shrinks
    // again), within recovery.max_restarts.
    return OnBatchFailure(
        absl::Status(grown.code(), absl::StrCat("growing back failed: ", grown.message())));
  }
  const std::string summary =
      absl::StrCat("grew back to world size ", config_.world_size, " at step ", step,
                   " from checkpoint ", *checkpoint, " in ",
                   absl::FormatDuration(absl::Trunc(absl::Now() - began, absl::Milliseconds(1))),
                   " (no step lost)");
  spdlog::info("job {}: {}", config_.name, summary);
  return states_.Transition(v1::READY, summary);
}

}  // namespace flatshard
