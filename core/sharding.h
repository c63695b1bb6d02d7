// Sharding strategies and the rules that follow from them: when to free the
// unsharded buffer (docs/fsdp-semantics.md §2.5), the gradient pre/post divide factors (§3.4),
// the hybrid rank layout (a replicate-major [replicas, shard] mesh) and its
// process groups, and mixed-precision dtype resolution (§4.2).
#ifndef FLATSHARD_CORE_SHARDING_H_
#define FLATSHARD_CORE_SHARDING_H_

#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/dtype.h"

namespace flatshard {

enum class ShardingStrategy {
  kFullShard,
  kShardGradOp,
  kNoShard,
  kHybridShard,
  kHybridShardZero2,
};

absl::string_view ShardingStrategyName(ShardingStrategy strategy);  // "FULL_SHARD"
// Accepts FSDP's names, case-insensitively, with '-' or '_'.
absl::StatusOr<ShardingStrategy> ParseShardingStrategy(absl::string_view name);

bool IsHybrid(ShardingStrategy strategy);
// NO_SHARD keeps whole parameters; every other strategy shards them.
bool IsSharded(ShardingStrategy strategy);

// world_size == 1 forces NO_SHARD (upstream _init_core_state).
ShardingStrategy EffectiveStrategy(ShardingStrategy strategy, int world_size);

// docs/fsdp-semantics.md §2.5, post-forward: the root never frees after forward.
bool ReshardAfterForward(ShardingStrategy strategy, bool is_root);
// docs/fsdp-semantics.md §2.5, post-backward: inside no_sync the ZeRO-2 strategies keep the
// unsharded params; NO_SHARD never frees.
bool FreeAfterBackward(ShardingStrategy strategy, bool sync_gradients);

// docs/fsdp-semantics.md §3.4. pre * post == data-parallel world size.
struct GradientDivideFactors {
  double pre = 1.0;
  double post = 1.0;
};
// `data_parallel_world_size` is shard size times replicas under hybrid
// strategies, else the world size.
GradientDivideFactors ComputeGradientDivideFactors(int data_parallel_world_size);

// How W ranks are laid out: a replicate-major [replicas, shard_size] mesh, so
// rank = replica * shard_size + shard_rank, like a 2-D DeviceMesh with dim 0 =
// replicate, dim 1 = shard. Non-hybrid strategies are one replica of W.
struct RankLayout {
  int world_size = 1;
  int shard_size = 1;  // ranks a unit is sharded over
  int replicas = 1;    // world_size / shard_size

  int ShardRank(int rank) const { return rank % shard_size; }
  int ReplicaIndex(int rank) const { return rank / shard_size; }
  // The ranks this rank shards with (its row of the mesh), in shard-rank order.
  std::vector<int> ShardGroup(int rank) const;
  // The ranks holding the same shard in other replicas (its column).
  std::vector<int> ReplicateGroup(int rank) const;
  // Every shard group / replicate group, for creating communicators in a fixed
  // order on all ranks.
  std::vector<std::vector<int>> AllShardGroups() const;
  std::vector<std::vector<int>> AllReplicateGroups() const;
};

// Errors: world_size < 1; hybrid without a shard group size, or one that does
// not divide the world size; a shard group size given for a non-hybrid strategy.
absl::StatusOr<RankLayout> ComputeRankLayout(ShardingStrategy strategy, int world_size,
                                             int hybrid_shard_group_size);

// When backward prefetches the next unit's all-gather (docs/fsdp-semantics.md §9.2).
enum class BackwardPrefetch { kPre, kPost, kNone };

// How a job shards its units: FSDP's constructor arguments. The job config, the
// plan, the step-program compiler and the runtime all read this one struct.
struct ShardingSettings {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;
  int hybrid_shard_group_size = 0;  // the hybrid strategies only
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  bool limit_all_gathers = true;
  bool use_orig_params = false;
  std::optional<DType> param_dtype;  // mixed precision; unset: off
  std::optional<DType> reduce_dtype;
  // CPUOffload(offload_params): on a GPU build the master shard lives in pinned
  // host memory; on a host build parameters are already there, so it changes
  // nothing but is accepted and reported.
  bool cpu_offload = false;
  bool sync_module_states = false;
};

// docs/fsdp-semantics.md §4.2: the dtypes used for compute/all-gather and for reduction.
struct ResolvedPrecision {
  DType param_dtype;   // _fwd_bwd_param_dtype
  DType reduce_dtype;  // _reduce_dtype
  bool uses_param_mixed_precision = false;
  bool uses_reduce_mixed_precision = false;
};
ResolvedPrecision ResolvePrecision(DType orig_dtype, std::optional<DType> param_dtype,
                                   std::optional<DType> reduce_dtype);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_SHARDING_H_
