#include "core/sharding.h"

#include <algorithm>
#include <cctype>
#include <string>

#include "absl/strings/str_cat.h"

namespace flatshard {

absl::string_view ShardingStrategyName(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::kFullShard:
      return "FULL_SHARD";
    case ShardingStrategy::kShardGradOp:
      return "SHARD_GRAD_OP";
    case ShardingStrategy::kNoShard:
      return "NO_SHARD";
    case ShardingStrategy::kHybridShard:
      return "HYBRID_SHARD";
    case ShardingStrategy::kHybridShardZero2:
      return "HYBRID_SHARD_ZERO2";
  }
  return "?";
}

absl::StatusOr<ShardingStrategy> ParseShardingStrategy(absl::string_view name) {
  std::string upper(name);
  std::transform(upper.begin(), upper.end(), upper.begin(), [](unsigned char c) {
    return c == '-' ? '_' : static_cast<char>(std::toupper(c));
  });
  if (upper == "_HYBRID_SHARD_ZERO2") upper = "HYBRID_SHARD_ZERO2";
  for (ShardingStrategy s :
       {ShardingStrategy::kFullShard, ShardingStrategy::kShardGradOp, ShardingStrategy::kNoShard,
        ShardingStrategy::kHybridShard, ShardingStrategy::kHybridShardZero2}) {
    if (ShardingStrategyName(s) == upper) return s;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown sharding strategy '", name,
                   "'; expected FULL_SHARD, SHARD_GRAD_OP, NO_SHARD, HYBRID_SHARD or "
                   "HYBRID_SHARD_ZERO2"));
}

bool IsHybrid(ShardingStrategy strategy) {
  return strategy == ShardingStrategy::kHybridShard ||
         strategy == ShardingStrategy::kHybridShardZero2;
}

bool IsSharded(ShardingStrategy strategy) { return strategy != ShardingStrategy::kNoShard; }

ShardingStrategy EffectiveStrategy(ShardingStrategy strategy, int world_size) {
  return world_size == 1 ? ShardingStrategy::kNoShard : strategy;
}

bool ReshardAfterForward(ShardingStrategy strategy, bool is_root) {
  return !is_root &&
         (strategy == ShardingStrategy::kFullShard || strategy == ShardingStrategy::kHybridShard);
}

bool FreeAfterBackward(ShardingStrategy strategy, bool sync_gradients) {
  if (strategy == ShardingStrategy::kNoShard) return false;
  return sync_gradients || strategy == ShardingStrategy::kFullShard ||
         strategy == ShardingStrategy::kHybridShard;
}

GradientDivideFactors ComputeGradientDivideFactors(int data_parallel_world_size) {
  // DefaultState._get_gradient_predivide_factor: double while it divides the
  // world size and stays below its cofactor.
  int pre = 1;
  while (data_parallel_world_size % pre == 0 && data_parallel_world_size / pre > pre) {
    pre *= 2;
  }
  return GradientDivideFactors{static_cast<double>(pre),
                               static_cast<double>(data_parallel_world_size) / pre};
}

std::vector<int> RankLayout::ShardGroup(int rank) const {
  std::vector<int> group;
  group.reserve(static_cast<size_t>(shard_size));
  const int base = ReplicaIndex(rank) * shard_size;
  for (int i = 0; i < shard_size; ++i) group.push_back(base + i);
  return group;
}

std::vector<int> RankLayout::ReplicateGroup(int rank) const {
  std::vector<int> group;
  group.reserve(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r) group.push_back(r * shard_size + ShardRank(rank));
  return group;
}

std::vector<std::vector<int>> RankLayout::AllShardGroups() const {
  std::vector<std::vector<int>> groups;
  groups.reserve(static_cast<size_t>(replicas));
  for (int r = 0; r < replicas; ++r) groups.push_back(ShardGroup(r * shard_size));
  return groups;
}

std::vector<std::vector<int>> RankLayout::AllReplicateGroups() const {
  std::vector<std::vector<int>> groups;
  groups.reserve(static_cast<size_t>(shard_size));
  for (int s = 0; s < shard_size; ++s) groups.push_back(ReplicateGroup(s));
  return groups;
}

absl::StatusOr<RankLayout> ComputeRankLayout(ShardingStrategy strategy, int world_size,
                                             int hybrid_shard_group_size) {
  if (world_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("world_size must be >= 1, got ", world_size));
  }
  if (!IsHybrid(strategy)) {
    if (hybrid_shard_group_size != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("sharding.hybrid_shard_group_size is only for HYBRID_SHARD and "
                       "HYBRID_SHARD_ZERO2, not ",
                       ShardingStrategyName(strategy)));
    }
    return RankLayout{world_size, world_size, 1};
  }
  if (hybrid_shard_group_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sharding.hybrid_shard_group_size is required for ", ShardingStrategyName(strategy),
        " (manual wrapping with a hybrid strategy needs an explicit shard group)"));
  }
  if (world_size % hybrid_shard_group_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat("sharding.hybrid_shard_group_size ",
                                                   hybrid_shard_group_size,
                                                   " does not divide the world size ", world_size));
  }
  return RankLayout{world_size, hybrid_shard_group_size, world_size / hybrid_shard_group_size};
}

ResolvedPrecision ResolvePrecision(DType orig_dtype, std::optional<DType> param_dtype,
                                   std::optional<DType> reduce_dtype) {
  ResolvedPrecision resolved{orig_dtype, orig_dtype};
  if (param_dtype.has_value() && !reduce_dtype.has_value()) {
    resolved.param_dtype = resolved.reduce_dtype = *param_dtype;
  } else {
    resolved.param_dtype = param_dtype.value_or(orig_dtype);
    resolved.reduce_dtype = reduce_dtype.value_or(orig_dtype);
  }
  resolved.uses_param_mixed_precision = resolved.param_dtype != orig_dtype;
  resolved.uses_reduce_mixed_precision = resolved.reduce_dtype != orig_dtype;
  return resolved;
}

}  // namespace flatshard
