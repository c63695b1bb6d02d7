// Tests core/unit_layout.h: the one unit-layout builder gives the layouts the
// plan reports (the plan is built on it, and the workers build their units
// from it) for every strategy, hybrid groups, use_orig_params and mixed
// precision; errors name the unit.
#include "core/unit_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/model_spec_yaml.h"
#include "core/plan.h"
#include "storage/spec_files.h"
#include "tests/unit/core/test_paths.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

struct Case {
  const char* name;
  int world_size;
  ShardingStrategy strategy;
  int hybrid_shard_group_size;
  bool use_orig_params;
  std::optional<DType> param_dtype;
};

class UnitLayoutTest : public ::testing::TestWithParam<Case> {};

TEST_P(UnitLayoutTest, AgreesWithThePlan) {
  const Case& c = GetParam();
  auto spec = LoadModelSpecFile(testing_paths::Example("gpt-7m.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  const WrapPolicy policy = *ParseWrapPolicy("module-type:TransformerBlock");
  ShardingSettings sharding;
  sharding.strategy = c.strategy;
  sharding.hybrid_shard_group_size = c.hybrid_shard_group_size;
  sharding.use_orig_params = c.use_orig_params;
  sharding.param_dtype = c.param_dtype;
  auto plan = ComputePlan(*spec, policy, c.world_size, sharding, OptimizerSettings{});
  ASSERT_TRUE(plan.ok()) << plan.status();

  auto index = IndexModel(*spec);
  ASSERT_TRUE(index.ok());
  auto units = ComputeUnits(*index, policy);
  ASSERT_TRUE(units.ok());
  auto ranks = ComputeRankLayout(c.strategy, c.world_size, c.hybrid_shard_group_size);
  ASSERT_TRUE(ranks.ok());
  auto layouts = ComputeUnitLayouts(*units, sharding, *ranks);
  ASSERT_TRUE(layouts.ok()) << layouts.status();

  ASSERT_EQ(layouts->size(), plan->units.size());
  for (size_t u = 0; u < layouts->size(); ++u) {
    const FlatParamLayout& mine = (*layouts)[u].layout;
    const FlatParamLayout& planned = plan->units[u].layout;
    EXPECT_EQ(mine.numels_with_padding(), planned.numels_with_padding()) << u;
    EXPECT_EQ(mine.is_padding_mask(), planned.is_padding_mask()) << u;
    EXPECT_EQ(mine.unpadded_unsharded_numel(), planned.unpadded_unsharded_numel()) << u;
    EXPECT_EQ(mine.sharded_numel(), planned.sharded_numel()) << u;
    EXPECT_EQ(mine.world_size(), planned.world_size()) << u;
    EXPECT_EQ(mine.options().sharded, planned.options().sharded) << u;
    EXPECT_EQ((*layouts)[u].precision.param_dtype, plan->precision.param_dtype) << u;
    EXPECT_EQ((*layouts)[u].precision.reduce_dtype, plan->precision.reduce_dtype) << u;
    // Sharded over the shard group, never the whole world under hybrid.
    EXPECT_EQ(mine.world_size(), ranks->shard_size) << u;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Settings, UnitLayoutTest,
    ::testing::Values(
        Case{"full_shard_w8", 8, ShardingStrategy::kFullShard, 0, false, {}},
        Case{"full_shard_orig_bf16_w4", 4, ShardingStrategy::kFullShard, 0, true, DType::kBFloat16},
        Case{"shard_grad_op_w3", 3, ShardingStrategy::kShardGradOp, 0, true, {}},
        Case{"no_shard_w4", 4, ShardingStrategy::kNoShard, 0, false, {}},
        Case{"single_rank_runs_unsharded", 1, ShardingStrategy::kFullShard, 0, false, {}},
        Case{"hybrid_2x4", 8, ShardingStrategy::kHybridShard, 4, true, DType::kFloat16},
        Case{"hybrid_zero2_3x2", 6, ShardingStrategy::kHybridShardZero2, 2, false, {}}),
    [](const ::testing::TestParamInfo<Case>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(UnitLayoutErrorsTest, NameTheUnit) {
  Unit unit;
  unit.index = 2;
  unit.module_fqn = "blocks.1";
  unit.params.push_back(UnitParam{"blocks.1.w", 0, {4}, 4, DType::kFloat32, true});
  unit.params.push_back(UnitParam{"blocks.1.b", 1, {4}, 4, DType::kBFloat16, true});
  RankLayout ranks;
  ranks.world_size = 2;
  ranks.shard_size = 2;
  auto layouts = ComputeUnitLayouts({unit}, ShardingSettings{}, ranks);
  ASSERT_FALSE(layouts.ok());
  EXPECT_THAT(std::string(layouts.status().message()), HasSubstr("unit 2 (blocks.1)"));
}

}  // namespace
}  // namespace flatshard
