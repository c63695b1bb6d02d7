// What `flatshard up` does with a stop signal before it stops the daemons:
// the workers hold the only copy of the job's state, and the next `up` on
// the state dir continues the job from the checkpoint a restart restores
// (docs/control-plane.md). So each job whose state is not that checkpoint
// is saved first, as the Kubernetes workers' preStop hook does
// (deploy/k8s/base/save-before-stop.sh).
#ifndef FLATSHARD_CLIENT_SAVE_BEFORE_STOP_H_
#define FLATSHARD_CLIENT_SAVE_BEFORE_STOP_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "client/flatshard_client.h"

namespace flatshard {

// The jobs in a state that can save (READY, TRAINING, IDLE), past their
// initialization (a step past 0, or a checkpoint loaded), whose state is
// not the checkpoint a restart would restore (v1::CheckpointInfo's
// recovery_target: the newest of the job's history loadable at its world
// size), as the coordinator knows it (v1::Job::state_checkpoint): not by the
// step, since a job that loaded an older checkpoint and trained back to the
// newest one's step holds another state at that step. A coordinator that
// does not know (a state dir from before it kept it) has the job saved: one
// more save, nothing lost.
struct UnsavedJob {
  std::string name;
  int64_t step = 0;
  // What a restart would restore: that checkpoint's name and step, or ""
  // and 0 (the job's initialization) when none.
  std::string restored_name;
  int64_t restored_step = 0;
};
absl::StatusOr<std::vector<UnsavedJob>> FindUnsavedJobs(FlatshardClient& client);

// Saves each of `jobs` as "stop-<UTC time of `now`>" (with "-2", "-3", ...
// after it where the job has a checkpoint of that name: two stops in one
// second) with the job's own state-dict settings, telling `say` (one line a
// call) what it does and, for a save that failed, where the next start
// continues; the first failure, after trying them all.
absl::Status SaveUnsavedJobs(FlatshardClient& client, const std::vector<UnsavedJob>& jobs,
                             absl::Time now, const std::function<void(const std::string&)>& say);

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_SAVE_BEFORE_STOP_H_
