#include "coordinator/recovery_plan.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flatshard {

std::string SeatDevice(const RecoveryCandidates& candidates) {
  if (!candidates.device.empty() || candidates.survivors.empty()) return candidates.device;
  return candidates.survivors.front().device;
}

absl::StatusOr<RecoveryChoice> ChooseRecovery(const v1::JobSpec& spec,
                                              const RecoverySettings& recovery,
                                              const RecoveryCandidates& candidates) {
  // One kind of device per job: spares of another kind cannot take a seat.
  const std::string device = SeatDevice(candidates);
  std::vector<WorkerRecord> spares;
  for (const WorkerRecord& spare : candidates.spares) {
    if (device.empty() || spare.device == device) spares.push_back(spare);
  }
  const int available = static_cast<int>(candidates.survivors.size() + spares.size());
  const int top = std::min(spec.world_size(), available);
  std::string last_reason;
  for (int world = top; world >= std::max(1, recovery.min_world_size); --world) {
    v1::JobSpec epoch_spec = spec;
    epoch_spec.set_world_size(world);
    epoch_spec.clear_rank_by_worker_id();
    absl::StatusOr<JobConfig> config = JobConfigFromProto(epoch_spec);
    if (!config.ok()) {
      if (last_reason.empty()) last_reason = std::string(config.status().message());
      continue;
    }
    RecoveryChoice choice;
    choice.spec = std::move(epoch_spec);
    choice.config = *std::move(config);
    const size_t seats = static_cast<size_t>(world);
    for (const WorkerRecord& w : candidates.survivors) {
      if (choice.members.size() == seats) break;
      choice.members.push_back(w);
    }
    for (const WorkerRecord& w : spares) {
      if (choice.members.size() == seats) break;
      choice.members.push_back(w);
      choice.spare_used = true;
    }
    return choice;
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot re-form: ", candidates.survivors.size(), " surviving worker(s) and ", spares.size(),
      " spare(s) are live, the job runs at world size ", spec.world_size(),
      " and may shrink to recovery.min_world_size ", recovery.min_world_size,
      last_reason.empty() ? std::string()
                          : absl::StrCat(" (the largest size tried is invalid: ", last_reason, ")"),
      "; start more workers and create the job again"));
}

}  // namespace flatshard
