// The dry-run plan of a job: units and their layouts, every rank's shard ranges
// and per-parameter slices, per-rank memory, and the bytes each collective moves
// per training step. `flatshard plan` prints it and the coordinator's Plan RPC
// returns it; the JSON form is documented in docs/plan-json.md and is stable
// (fields are only ever added).
#ifndef FLATSHARD_CORE_PLAN_H_
#define FLATSHARD_CORE_PLAN_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/flat_param_layout.h"
#include "core/model_spec.h"
#include "core/optimizer.h"
#include "core/sharding.h"
#include "core/wrap_policy.h"

namespace flatshard {

struct UnitPlan {
  Unit unit;
  FlatParamLayout layout;
  std::vector<ShardInfo> shards;  // one per shard rank (0..shard_size-1)
};

struct CollectivePlan {
  std::string op;  // all_gather, reduce_scatter, all_reduce
  int unit = 0;
  std::string group;  // world, shard, replicate
  int group_size = 1;
  int count = 0;  // times per step
  DType dtype = DType::kFloat32;
  int64_t bytes = 0;  // buffer size per call (the gathered / reduced tensor)
  // Bytes each rank sends per call with a ring algorithm: (n-1)/n of the buffer
  // for all-gather and reduce-scatter, 2(n-1)/n for all-reduce.
  int64_t wire_bytes_per_rank = 0;
};

struct MemoryPlan {
  int64_t sharded_param_bytes = 0;        // full-precision master shards
  int64_t low_precision_shard_bytes = 0;  // transient, param mixed precision only
  int64_t grad_bytes = 0;                 // sharded gradients
  int64_t optimizer_state_bytes = 0;
  int64_t peak_unsharded_bytes = 0;           // with limit_all_gathers
  int64_t peak_unsharded_bytes_no_limit = 0;  // without the limiter
  int64_t total_bytes = 0;  // params + grads + optimizer + peak_unsharded (chosen limiter)
};

struct Plan {
  std::string model_name;
  std::string policy;
  // The inputs, as the job (or `flatshard plan`'s flags) gave them.
  int world_size = 1;
  ShardingSettings sharding;
  OptimizerSettings optimizer;
  ShardingStrategy effective_strategy = ShardingStrategy::kFullShard;
  RankLayout ranks;
  ResolvedPrecision precision{DType::kFloat32, DType::kFloat32};
  GradientDivideFactors divide;
  int64_t total_params = 0;
  std::vector<UnitPlan> units;
  MemoryPlan memory_per_rank;  // identical on every rank: all shards have S elements
  std::vector<CollectivePlan> collectives;
  std::vector<std::string> warnings;
};

// The plan of a job: a JobConfig's model, wrap_policy, world_size, sharding
// and optimizer (JobConfigFromProto validates a job by computing its plan).
absl::StatusOr<Plan> ComputePlan(const ModelSpec& spec, const WrapPolicy& policy, int world_size,
                                 const ShardingSettings& sharding,
                                 const OptimizerSettings& optimizer);

// The plan's name for the optimizer: OptimizerKindName, except "sgd-momentum"
// for SGD with momentum, which keeps a state tensor (docs/plan-json.md).
std::string PlanOptimizerName(const OptimizerSettings& optimizer);

// Stable JSON form (docs/plan-json.md). `indent` < 0 gives one line.
std::string PlanToJson(const Plan& plan, int indent = 2);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_PLAN_H_
