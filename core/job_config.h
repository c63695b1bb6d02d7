// A training job as the coordinator and workers use it, converted from its wire
// form (flatshard.v1.JobSpec) with every field validated: errors are
// INVALID_ARGUMENT naming the field and the problem
// ("job.sharding.hybrid_shard_group_size 4 does not divide the world size 6"),
// so a bad request is refused before anything is created.
#ifndef FLATSHARD_CORE_JOB_CONFIG_H_
#define FLATSHARD_CORE_JOB_CONFIG_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/model_spec.h"
#include "core/optimizer.h"
#include "core/sharding.h"
#include "core/wrap_policy.h"
#include "flatshard/v1/job.pb.h"

namespace flatshard {

struct DataSettings {
  std::string kind;  // regression, classification, tokens, npy
  int64_t global_batch_size = 0;
  int64_t sequence_length = 1;
  uint64_t seed = 0;
  std::string path;
};

// What the coordinator does when a rank fails (RecoveryPolicy with defaults).
struct RecoverySettings {
  int max_restarts = 3;
  int min_world_size = 1;
  double spare_wait_s = 5.0;
  double min_world_wait_s = 600.0;  // while fewer than min_world_size are live
};

// THE job configuration: everything else (the plan, the step programs, the
// runtime's options, checkpoint manifests) takes its settings from here by
// value, never by copying fields into look-alike structs.
// What the workers must know of checkpoints.* (the schedule itself is the
// coordinator's, read from the spec).
struct CheckpointSettings {
  // Peer snapshots after every K-th step (docs/fault-tolerance.md); 0: off.
  int64_t in_memory_every_steps = 0;
};

struct JobConfig {
  std::string name;
  ModelSpec model;
  WrapPolicy wrap_policy;
  int world_size = 0;
  ShardingSettings sharding;
  OptimizerSettings optimizer;
  DataSettings data;
  uint64_t seed = 0;
  std::map<std::string, int> rank_by_worker_id;  // empty: ranks in registration order
  RecoverySettings recovery;
  CheckpointSettings checkpoints;
};

// Validates everything a job needs before any worker is touched, including that
// the wrap policy cuts the model into valid units for the world size.
absl::StatusOr<JobConfig> JobConfigFromProto(const v1::JobSpec& spec);

// The job's units (ComputeUnits over its model and policy).
absl::StatusOr<std::vector<Unit>> JobUnits(const JobConfig& job);

v1::Unit UnitToProto(const Unit& unit);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_JOB_CONFIG_H_
