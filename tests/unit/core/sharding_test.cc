// Tests core/sharding.h: the divide-factor table (docs/fsdp-semantics.md §3.4), the §2.5
// reshard table, world_size 1 -> NO_SHARD, the hybrid [replicas, shard] mesh and
// its groups, and mixed-precision resolution (§4.2).
#include "core/sharding.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// docs/fsdp-semantics.md §3.4: W=2 -> (2,1); 4 -> (2,2); 8 -> (4,2); 16 -> (4,4); 6 -> (4,1.5);
// 3 -> (2,1.5); and pre * post == W always.
TEST(GradientDivideFactorsTest, MatchesTheReferenceTable) {
  struct Row {
    int world;
    double pre, post;
  };
  for (const Row& row :
       {Row{2, 2, 1}, Row{3, 2, 1.5}, Row{4, 2, 2}, Row{6, 4, 1.5}, Row{8, 4, 2}, Row{16, 4, 4}}) {
    const GradientDivideFactors f = ComputeGradientDivideFactors(row.world);
    EXPECT_EQ(f.pre, row.pre) << "W=" << row.world;
    EXPECT_EQ(f.post, row.post) << "W=" << row.world;
  }
  for (int w = 1; w <= 256; ++w) {
    const GradientDivideFactors f = ComputeGradientDivideFactors(w);
    EXPECT_DOUBLE_EQ(f.pre * f.post, w) << "W=" << w;
  }
  EXPECT_EQ(ComputeGradientDivideFactors(1).pre, 1);
}

// docs/fsdp-semantics.md §2.5.
TEST(StrategyRulesTest, ReshardTable) {
  using S = ShardingStrategy;
  EXPECT_TRUE(ReshardAfterForward(S::kFullShard, false));
  EXPECT_FALSE(ReshardAfterForward(S::kFullShard, true));  // the root never frees
  EXPECT_TRUE(ReshardAfterForward(S::kHybridShard, false));
  EXPECT_FALSE(ReshardAfterForward(S::kShardGradOp, false));
  EXPECT_FALSE(ReshardAfterForward(S::kHybridShardZero2, false));
  EXPECT_FALSE(ReshardAfterForward(S::kNoShard, false));

  EXPECT_TRUE(FreeAfterBackward(S::kFullShard, false));
  EXPECT_TRUE(FreeAfterBackward(S::kShardGradOp, true));
  EXPECT_FALSE(FreeAfterBackward(S::kShardGradOp, false));  // inside no_sync
  EXPECT_FALSE(FreeAfterBackward(S::kHybridShardZero2, false));
  EXPECT_TRUE(FreeAfterBackward(S::kHybridShard, false));
  EXPECT_FALSE(FreeAfterBackward(S::kNoShard, true));

  EXPECT_EQ(EffectiveStrategy(S::kFullShard, 1), S::kNoShard);
  EXPECT_EQ(EffectiveStrategy(S::kFullShard, 2), S::kFullShard);
}

TEST(StrategyRulesTest, ParsesFsdpNames) {
  EXPECT_EQ(*ParseShardingStrategy("full_shard"), ShardingStrategy::kFullShard);
  EXPECT_EQ(*ParseShardingStrategy("SHARD-GRAD-OP"), ShardingStrategy::kShardGradOp);
  EXPECT_EQ(*ParseShardingStrategy("_HYBRID_SHARD_ZERO2"), ShardingStrategy::kHybridShardZero2);
  EXPECT_THAT(std::string(ParseShardingStrategy("ZERO3").status().message()),
              HasSubstr("unknown sharding strategy 'ZERO3'"));
}

// A replicate-major [replicas, shard] mesh: 8 ranks, shard groups of 4.
TEST(RankLayoutTest, HybridMeshGroups) {
  auto layout = ComputeRankLayout(ShardingStrategy::kHybridShard, 8, 4);
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->replicas, 2);
  EXPECT_EQ(layout->ShardRank(6), 2);
  EXPECT_EQ(layout->ReplicaIndex(6), 1);
  EXPECT_THAT(layout->ShardGroup(6), ElementsAre(4, 5, 6, 7));
  EXPECT_THAT(layout->ReplicateGroup(6), ElementsAre(2, 6));
  EXPECT_THAT(layout->AllShardGroups(),
              ElementsAre(ElementsAre(0, 1, 2, 3), ElementsAre(4, 5, 6, 7)));
  EXPECT_THAT(layout->AllReplicateGroups(), ElementsAre(ElementsAre(0, 4), ElementsAre(1, 5),
                                                        ElementsAre(2, 6), ElementsAre(3, 7)));
  // Hybrid divide factors use shard size * replicas (docs/fsdp-semantics.md §3.4).
  EXPECT_EQ(ComputeGradientDivideFactors(layout->world_size).pre, 4);
}

TEST(RankLayoutTest, Errors) {
  EXPECT_THAT(
      std::string(ComputeRankLayout(ShardingStrategy::kHybridShard, 6, 4).status().message()),
      HasSubstr("hybrid_shard_group_size 4 does not divide the world size 6"));
  EXPECT_THAT(
      std::string(ComputeRankLayout(ShardingStrategy::kHybridShard, 6, 0).status().message()),
      HasSubstr("hybrid_shard_group_size is required for HYBRID_SHARD"));
  EXPECT_THAT(std::string(ComputeRankLayout(ShardingStrategy::kFullShard, 6, 2).status().message()),
              HasSubstr("only for HYBRID_SHARD"));
  EXPECT_FALSE(ComputeRankLayout(ShardingStrategy::kFullShard, 0, 0).ok());
  auto flat = ComputeRankLayout(ShardingStrategy::kFullShard, 6, 0);
  ASSERT_TRUE(flat.ok());
  EXPECT_EQ(flat->shard_size, 6);
  EXPECT_EQ(flat->replicas, 1);
}

// docs/fsdp-semantics.md §4.2.
TEST(PrecisionTest, ResolvesLikeInitParamReduceDtypes) {
  ResolvedPrecision p = ResolvePrecision(DType::kFloat32, DType::kBFloat16, std::nullopt);
  EXPECT_EQ(p.param_dtype, DType::kBFloat16);
  EXPECT_EQ(p.reduce_dtype, DType::kBFloat16);  // reduce follows param_dtype
  EXPECT_TRUE(p.uses_param_mixed_precision);
  p = ResolvePrecision(DType::kFloat32, DType::kBFloat16, DType::kFloat32);
  EXPECT_EQ(p.reduce_dtype, DType::kFloat32);
  EXPECT_FALSE(p.uses_reduce_mixed_precision);
  p = ResolvePrecision(DType::kFloat32, std::nullopt, DType::kFloat16);
  EXPECT_EQ(p.param_dtype, DType::kFloat32);
  EXPECT_EQ(p.reduce_dtype, DType::kFloat16);
  p = ResolvePrecision(DType::kFloat32, std::nullopt, std::nullopt);
  EXPECT_FALSE(p.uses_param_mixed_precision);
  EXPECT_FALSE(p.uses_reduce_mixed_precision);
}

}  // namespace
}  // namespace flatshard
