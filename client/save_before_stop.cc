#include "client/save_before_stop.h"

#include <algorithm>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flatshard {

absl::StatusOr<std::vector<UnsavedJob>> FindUnsavedJobs(FlatshardClient& client) {
  absl::StatusOr<std::vector<v1::Job>> jobs = client.ListJobs();
  if (!jobs.ok()) return jobs.status();
  std::vector<UnsavedJob> unsaved;
  for (const v1::Job& job : *jobs) {
    const v1::JobState state = job.state();
    if (state != v1::READY && state != v1::TRAINING && state != v1::IDLE) continue;
    absl::StatusOr<std::vector<v1::CheckpointInfo>> checkpoints =
        client.ListCheckpoints(job.spec().name());
    if (!checkpoints.ok()) return checkpoints.status();
    // What the next start would restore, as the coordinator's recovery
    // picks it (the newest of the job's history its world can load).
    const auto restored =
        std::find_if(checkpoints->begin(), checkpoints->end(),
                     [](const v1::CheckpointInfo& c) { return c.recovery_target(); });
    // Exactly: the coordinator knows which checkpoint the ranks' state is
    // (none once it trained, or when it does not know).
    // (And at its step: a checkpoint rewritten under the same name since,
    // by `ckpt consolidate --out`, say, is not taken for it.)
    const bool held = restored != checkpoints->end() &&
                      restored->name() == job.state_checkpoint() && restored->step() == job.step();
    // A job still at its initialization is made again from its spec.
    if ((job.step() > 0 || !job.state_checkpoint().empty()) && !held) {
      unsaved.push_back(UnsavedJob{job.spec().name(), job.step(),
                                   restored != checkpoints->end() ? restored->name() : "",
                                   restored != checkpoints->end() ? restored->step() : 0});
    }
  }
  return unsaved;
}

absl::Status SaveUnsavedJobs(FlatshardClient& client, const std::vector<UnsavedJob>& jobs,
                             absl::Time now, const std::function<void(const std::string&)>& say) {
  absl::Status first;
  const std::string stem =
      absl::StrCat("stop-", absl::FormatTime("%Y%m%d-%H%M%S", now, absl::UTCTimeZone()));
  for (const UnsavedJob& job : jobs) {
    // A name an earlier stop in the same second took gets the next suffix.
    absl::StatusOr<std::vector<v1::CheckpointInfo>> listed = client.ListCheckpoints(job.name);
    absl::flat_hash_set<std::string> taken;
    if (listed.ok()) {
      for (const v1::CheckpointInfo& c : *listed) taken.insert(c.name());
    }
    std::string name = stem;
    for (int n = 2; taken.contains(name); ++n) name = absl::StrCat(stem, "-", n);
    say(absl::StrCat("saving job '", job.name, "' (step ", job.step, "; a restart would restore ",
                     job.restored_name.empty() ? std::string("its initialization")
                                               : absl::StrCat("checkpoint '", job.restored_name,
                                                              "' at step ", job.restored_step),
                     ", not this state) as '", name, "' before stopping..."));
    v1::SaveCheckpointRequest request;
    request.set_job(job.name);
    request.set_name(name);
    absl::StatusOr<v1::CheckpointProgress> saved = client.SaveCheckpoint(request);
    if (!saved.ok()) {
      say(absl::StrCat("  not saved: ", saved.status().message(),
                       "; the next `flatshard up` on this state dir continues it from ",
                       job.restored_name.empty()
                           ? std::string("step 0 (its initialization)")
                           : absl::StrCat("checkpoint '", job.restored_name, "' (step ",
                                          job.restored_step, ")")));
      if (first.ok()) first = saved.status();
      continue;
    }
    say(absl::StrFormat(
        "  saved '%s' at step %d (%.1f MB); the next `flatshard up` on this state dir continues "
        "from it",
        saved->name(), saved->step(), static_cast<double>(saved->bytes_written()) / 1e6));
  }
  return first;
}

}  // namespace flatshard
