// Who re-forms a job after a rank failed, and at what world size
// (docs/fault-tolerance.md). Pure: the caller finds out who is alive; this
// picks the seats. The survivors keep their order and the spares (live workers
// outside the failed epoch, on the same kind of device) fill the seats of the
// failed ranks; without enough of them the job shrinks to the largest world
// size the job's spec accepts (the global batch and a hybrid shard group must
// still divide it) that is at least recovery.min_world_size.
#ifndef FLATSHARD_COORDINATOR_RECOVERY_PLAN_H_
#define FLATSHARD_COORDINATOR_RECOVERY_PLAN_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "coordinator/membership.h"
#include "core/job_config.h"
#include "flatshard/v1/job.pb.h"

namespace flatshard {

struct RecoveryCandidates {
  std::vector<WorkerRecord> survivors;  // the failed epoch's live members, by rank
  std::vector<WorkerRecord> spares;     // live workers outside it, in membership order
  // The job's kind of device (its epoch's members'); empty: the survivors'.
  // Set where no member may survive, so that spares of another kind are
  // never seated beside each other.
  std::string device;
};

struct RecoveryChoice {
  std::vector<WorkerRecord> members;  // members[r] becomes rank r
  v1::JobSpec spec;                   // the new epoch's spec (its world size)
  JobConfig config;                   // JobConfigFromProto(spec)
  bool spare_used = false;
};

// The kind of device the re-formed epoch runs on: `candidates.device`, or
// the first survivor's; empty: any. A spare or a returning member of another
// kind takes no seat, and the wait for seats counts by the same rule.
std::string SeatDevice(const RecoveryCandidates& candidates);

// The world size recovery aims for: the spec's, or fewer when fewer workers
// are there. `spec` is the job's spec as created; ranks pinned by
// rank_by_worker_id are not kept (the failed worker's seat is given away).
// FAILED_PRECONDITION, saying how many workers there are and what the job
// needs, when no world size from min_world_size up works.
absl::StatusOr<RecoveryChoice> ChooseRecovery(const v1::JobSpec& spec,
                                              const RecoverySettings& recovery,
                                              const RecoveryCandidates& candidates);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_RECOVERY_PLAN_H_
