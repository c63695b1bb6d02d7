// Tests core/plan.h: units, shard ranges, memory and collective bytes for the GPT
// example, hybrid and NO_SHARD plans, the documented JSON fields, and errors.
#include "core/plan.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "nlohmann/json.hpp"

#include "core/model_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/unit/core/test_paths.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

class PlanTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto spec = LoadModelSpecFile(testing_paths::Example("gpt-7m.yaml"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *std::move(spec);
    policy_ = *ParseWrapPolicy("module-type:TransformerBlock");
  }
  ModelSpec spec_;
  WrapPolicy policy_;
};

TEST_F(PlanTest, FullShardOnEightRanks) {
  ShardingSettings sharding;
  sharding.param_dtype = DType::kBFloat16;
  auto plan = ComputePlan(spec_, policy_, 8, sharding, OptimizerSettings{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->units.size(), 9u);
  EXPECT_EQ(plan->divide.pre, 4);
  EXPECT_EQ(plan->divide.post, 2);
  EXPECT_EQ(plan->precision.reduce_dtype, DType::kBFloat16);

  const UnitPlan& root = plan->units[0];
  const UnitPlan& block = plan->units[1];
  ASSERT_EQ(block.shards.size(), 8u);
  EXPECT_EQ(block.layout.sharded_numel(), (789760 + 7) / 8);

  // Root: one all-gather (never freed after forward); blocks: two.
  int64_t gathered = 0;
  for (const CollectivePlan& c : plan->collectives) {
    if (c.op != "all_gather") continue;
    EXPECT_EQ(c.count, c.unit == 0 ? 1 : 2);
    EXPECT_EQ(c.bytes,
              plan->units[static_cast<size_t>(c.unit)].layout.padded_unsharded_numel() * 2);
    EXPECT_EQ(c.wire_bytes_per_rank, c.bytes * 7 / 8);
    gathered += c.count * c.bytes;
  }
  EXPECT_EQ(
      gathered,
      (root.layout.padded_unsharded_numel() + 16 * block.layout.padded_unsharded_numel()) * 2);

  // Peak with the limiter: the root plus two blocks; without it, every unit.
  const int64_t block_bytes = block.layout.padded_unsharded_numel() * 2;
  const int64_t root_bytes = root.layout.padded_unsharded_numel() * 2;
  EXPECT_EQ(plan->memory_per_rank.peak_unsharded_bytes, root_bytes + 2 * block_bytes);
  EXPECT_EQ(plan->memory_per_rank.peak_unsharded_bytes_no_limit, root_bytes + 8 * block_bytes);
  // AdamW keeps two fp32 states per element of every shard.
  EXPECT_EQ(plan->memory_per_rank.optimizer_state_bytes,
            2 * plan->memory_per_rank.sharded_param_bytes);
}

TEST_F(PlanTest, HybridAddsReplicaAllReduceAndShardsWithinTheGroup) {
  ShardingSettings sharding;
  sharding.strategy = ShardingStrategy::kHybridShard;
  sharding.hybrid_shard_group_size = 4;
  auto plan = ComputePlan(spec_, policy_, 8, sharding, OptimizerSettings{});
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->units[1].shards.size(), 4u);
  EXPECT_EQ(plan->units[1].layout.sharded_numel(), 789760 / 4);
  EXPECT_EQ(plan->divide.pre, 4);  // over all 8 data-parallel ranks
  int replicate = 0;
  for (const CollectivePlan& c : plan->collectives) {
    if (c.group == "replicate") {
      ++replicate;
      EXPECT_EQ(c.op, "all_reduce");
      EXPECT_EQ(c.group_size, 2);
      EXPECT_EQ(c.bytes, plan->units[static_cast<size_t>(c.unit)].layout.sharded_numel() * 4);
    }
  }
  EXPECT_EQ(replicate, 9);
}

TEST_F(PlanTest, SingleRankRunsAsNoShardWithAWarning) {
  auto plan = ComputePlan(spec_, policy_, 1, ShardingSettings{}, OptimizerSettings{});
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->effective_strategy, ShardingStrategy::kNoShard);
  ASSERT_EQ(plan->warnings.size(), 1u);
  EXPECT_THAT(plan->warnings[0], HasSubstr("runs as NO_SHARD"));
  EXPECT_EQ(plan->memory_per_rank.peak_unsharded_bytes, 0);
  for (const CollectivePlan& c : plan->collectives) EXPECT_EQ(c.op, "all_reduce");
}

TEST_F(PlanTest, JsonHasTheDocumentedFields) {
  ShardingSettings sharding;
  sharding.use_orig_params = true;
  auto plan = ComputePlan(spec_, policy_, 4, sharding, OptimizerSettings{});
  ASSERT_TRUE(plan.ok());
  const nlohmann::json j = nlohmann::json::parse(PlanToJson(*plan));
  EXPECT_EQ(j["format"], "flatshard.plan/v1");
  EXPECT_EQ(j["config"]["world_size"], 4);
  EXPECT_EQ(j["config"]["strategy"], "FULL_SHARD");
  ASSERT_EQ(j["units"].size(), 9u);
  const auto& unit = j["units"][1];
  for (const char* key : {"index", "module_fqn", "numel", "numels_with_padding", "is_padding_mask",
                          "unpadded_unsharded_numel", "sharded_numel", "padded_unsharded_numel",
                          "params", "shared_params", "shards"}) {
    EXPECT_TRUE(unit.contains(key)) << key;
  }
  EXPECT_EQ(unit["shards"].size(), 4u);
  EXPECT_EQ(unit["shards"][1]["start"], unit["sharded_numel"].get<int64_t>());
  EXPECT_TRUE(unit["shards"][0]["params"][0].contains("intra_param_end_idx"));
  EXPECT_EQ(j["units"][0]["shared_params"][0]["fqn"], "lm_head.weight");
  EXPECT_TRUE(j["memory_per_rank"].contains("peak_unsharded_bytes_no_limit"));
  EXPECT_TRUE(j["collective_totals_per_step"].contains("reduce_scatter"));
}

TEST_F(PlanTest, OptimizerStatesFollowTheSettings) {
  // SGD keeps a momentum buffer only with momentum; the plan names it apart.
  OptimizerSettings sgd;
  sgd.kind = OptimizerKind::kSgd;
  auto plain = ComputePlan(spec_, policy_, 2, ShardingSettings{}, sgd);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->memory_per_rank.optimizer_state_bytes, 0);
  EXPECT_EQ(nlohmann::json::parse(PlanToJson(*plain))["config"]["optimizer"], "sgd");
  sgd.sgd.momentum = 0.9;
  auto momentum = ComputePlan(spec_, policy_, 2, ShardingSettings{}, sgd);
  ASSERT_TRUE(momentum.ok());
  EXPECT_EQ(momentum->memory_per_rank.optimizer_state_bytes,
            momentum->memory_per_rank.sharded_param_bytes);
  EXPECT_EQ(nlohmann::json::parse(PlanToJson(*momentum))["config"]["optimizer"], "sgd-momentum");
  OptimizerSettings adam;
  adam.kind = OptimizerKind::kAdam;
  adam.adam.amsgrad = true;
  auto amsgrad = ComputePlan(spec_, policy_, 2, ShardingSettings{}, adam);
  ASSERT_TRUE(amsgrad.ok());
  EXPECT_EQ(amsgrad->memory_per_rank.optimizer_state_bytes,
            3 * amsgrad->memory_per_rank.sharded_param_bytes);
  const nlohmann::json config = nlohmann::json::parse(PlanToJson(*amsgrad))["config"];
  EXPECT_EQ(config["optimizer"], "adam");
  EXPECT_EQ(config["amsgrad"], true);
}

TEST_F(PlanTest, Errors) {
  ShardingSettings sharding;
  const OptimizerSettings optimizer;
  EXPECT_THAT(std::string(ComputePlan(spec_, policy_, 0, sharding, optimizer).status().message()),
              HasSubstr("world_size must be between 1 and 65536, got 0"));
  sharding.strategy = ShardingStrategy::kHybridShard;
  sharding.hybrid_shard_group_size = 4;
  EXPECT_THAT(std::string(ComputePlan(spec_, policy_, 6, sharding, optimizer).status().message()),
              HasSubstr("does not divide the world size 6"));
  sharding.strategy = ShardingStrategy::kFullShard;
  sharding.hybrid_shard_group_size = 0;
  sharding.param_dtype = DType::kInt32;
  EXPECT_THAT(std::string(ComputePlan(spec_, policy_, 6, sharding, optimizer).status().message()),
              HasSubstr("mixed_precision.param_dtype must be a floating dtype"));
  EXPECT_THAT(std::string(ParseOptimizerKind("lion").status().message()),
              HasSubstr("unknown optimizer"));
}

}  // namespace
}  // namespace flatshard
