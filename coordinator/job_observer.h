// What a TrainingJob reports as it runs, for the coordinator's metrics:
// finished steps, command batch round trips, checkpoint saves, recoveries. Optional
// (TrainingJobOptions::observer); the job knows nothing of Prometheus.
#ifndef FLATSHARD_COORDINATOR_JOB_OBSERVER_H_
#define FLATSHARD_COORDINATOR_JOB_OBSERVER_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "flatshard/v1/job.pb.h"
#include "flatshard/v1/worker.pb.h"

namespace flatshard {

class JobObserver {
 public:
  virtual ~JobObserver() = default;

  // Called once per job, before anything else about it.
  virtual void OnJobCreated(const std::string& job) = 0;
  // An optimizer step finished on every rank; `samples` across the world.
  virtual void OnStep(const std::string& job, const v1::StepResult& step, int64_t samples) = 0;
  // A command batch succeeded on every rank after `round_trip`.
  virtual void OnBatch(const std::string& job, const v1::CommandBatch& batch,
                       absl::Duration round_trip) = 0;
  // A checkpoint save ended, committed or not, `duration` after it began.
  virtual void OnCheckpointSave(const std::string& job, v1::StateDictType type,
                                absl::Duration duration,
                                const absl::StatusOr<v1::CheckpointInfo>& outcome) = 0;
  // An automatic recovery brought the job back (docs/fault-tolerance.md).
  virtual void OnRecovery(const std::string& job, const v1::Recovery& recovery) = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_JOB_OBSERVER_H_
