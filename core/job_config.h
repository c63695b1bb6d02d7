// A training job as the coordinator and workers use it, converted from its wire
// form (flatshard.v1.JobSpec) with every field validated: errors are
// INVALID_ARGUMENT naming the field and the problem
// ("job.sharding.hybrid_shard_group_size 4 does not divide the world size 6"),
// so a bad request is refused before anything is created.
#ifndef FLATSHARD_CORE_JOB_CONFIG_H_
#define FLATSHARD_CORE_JOB_CONFIG_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/model_spec.h"
#include "core/optimizer.h"
#include "core/plan.h"
#include "core/sharding.h"
#include "core/step_program.h"
#include "core/wrap_policy.h"
#include "flatshard/v1/job.pb.h"

namespace flatshard {

struct ShardingSettings {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  int hybrid_shard_group_size = 0;
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  bool limit_all_gathers = true;
  bool use_orig_params = false;
  std::optional<DType> param_dtype;
  std::optional<DType> reduce_dtype;
  bool cpu_offload = false;
  bool sync_module_states = false;
};

struct OptimizerSettings {
  enum class Kind { kSgd, kAdam, kAdamW };
  Kind kind = Kind::kAdamW;
  SgdOptions sgd;
  AdamOptions adam;
  double max_grad_norm = 0.0;  // 0: no clipping
  double grad_norm_type = 2.0;
};

struct DataSettings {
  std::string kind;  // regression, classification, tokens, npy
  int64_t global_batch_size = 0;
  int64_t sequence_length = 1;
  uint64_t seed = 0;
  std::string path;
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
};

// Validates everything a job needs before any worker is touched, including that
// the wrap policy cuts the model into valid units for the world size.
absl::StatusOr<JobConfig> JobConfigFromProto(const v1::JobSpec& spec);

// The plan's options for the job (what `flatshard plan` and Plan show).
PlanOptions PlanOptionsFromJob(const JobConfig& job);

// The job's units (ComputeUnits over its model and policy).
absl::StatusOr<std::vector<Unit>> JobUnits(const JobConfig& job);

v1::Unit UnitToProto(const Unit& unit);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_JOB_CONFIG_H_
