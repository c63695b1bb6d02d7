// Tests core/job_config.h: a good JobSpec converts with FSDP's defaults, and each
// kind of bad spec is INVALID_ARGUMENT naming the field and the problem.
#include "core/job_config.h"

#include <cmath>
#include <functional>
#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/model_spec_proto.h"
#include "core/model_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/unit/core/test_paths.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

v1::JobSpec GoodSpec() {
  v1::JobSpec spec;
  spec.set_name("mlp-job");
  spec.set_world_size(4);
  auto model = LoadModelSpecFile(testing_paths::Example("mlp.yaml"));
  EXPECT_TRUE(model.ok());
  *spec.mutable_model() = ModelSpecToProto(*model);
  spec.mutable_wrap_policy()->mutable_module_type()->add_module_types("Residual");
  spec.mutable_sharding()->set_strategy(v1::FULL_SHARD);
  spec.mutable_sharding()->mutable_mixed_precision()->set_param_dtype(v1::DTYPE_BFLOAT16);
  spec.mutable_optimizer()->set_lr(1e-3);
  spec.mutable_optimizer()->mutable_adamw()->set_weight_decay(0.01);
  spec.mutable_data()->set_global_batch_size(32);
  return spec;
}

TEST(JobConfigTest, GoodSpecConvertsWithFsdpDefaults) {
  auto job = JobConfigFromProto(GoodSpec());
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->world_size, 4);
  EXPECT_EQ(job->sharding.strategy, ShardingStrategy::kFullShard);
  EXPECT_EQ(job->sharding.backward_prefetch, BackwardPrefetch::kPre);
  EXPECT_TRUE(job->sharding.limit_all_gathers);  // unset means FSDP's default
  EXPECT_EQ(job->sharding.param_dtype, DType::kBFloat16);
  EXPECT_EQ(job->optimizer.kind, OptimizerKind::kAdamW);
  EXPECT_EQ(job->optimizer.adam.beta2, 0.999);
  EXPECT_TRUE(job->optimizer.adam.decoupled_weight_decay);
  EXPECT_EQ(job->data.kind, "regression");
  EXPECT_EQ(job->wrap_policy.kind, WrapPolicy::Kind::kModuleType);

  v1::JobSpec limited = GoodSpec();
  limited.mutable_sharding()->set_limit_all_gathers(false);
  EXPECT_FALSE(JobConfigFromProto(limited)->sharding.limit_all_gathers);
}

struct BadJob {
  const char* name;
  std::function<void(v1::JobSpec&)> mutate;
  const char* expected;
};

void PrintTo(const BadJob& bad, std::ostream* os) { *os << bad.name; }

class BadJobTest : public ::testing::TestWithParam<BadJob> {};

TEST_P(BadJobTest, IsInvalidArgumentNamingTheField) {
  v1::JobSpec spec = GoodSpec();
  GetParam().mutate(spec);
  auto job = JobConfigFromProto(spec);
  ASSERT_FALSE(job.ok());
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(job.status().message()), HasSubstr(GetParam().expected));
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, BadJobTest,
    ::testing::Values(
        BadJob{"empty_name", [](v1::JobSpec& s) { s.set_name(""); }, "job.name must be 1-128"},
        BadJob{"path_name", [](v1::JobSpec& s) { s.set_name("../etc"); }, "job.name must be"},
        BadJob{"zero_world", [](v1::JobSpec& s) { s.set_world_size(0); },
               "job.world_size must be between 1 and 65536, got 0"},
        BadJob{"no_model", [](v1::JobSpec& s) { s.clear_model(); }, "job.model is required"},
        BadJob{"empty_model",
               [](v1::JobSpec& s) {
                 s.mutable_model()->mutable_root()->clear_children();
                 s.mutable_model()->mutable_root()->clear_params();
               },
               "model has no parameters"},
        BadJob{"duplicate_fqns",
               [](v1::JobSpec& s) {
                 auto* root = s.mutable_model()->mutable_root();
                 *root->add_children() = root->children(0);
               },
               "duplicate FQN 'input'"},
        BadJob{"unknown_strategy",
               [](v1::JobSpec& s) {
                 s.mutable_sharding()->set_strategy(static_cast<v1::ShardingStrategy>(42));
               },
               "job.sharding.strategy has unknown value 42"},
        BadJob{"hybrid_not_dividing",
               [](v1::JobSpec& s) {
                 s.mutable_sharding()->set_strategy(v1::HYBRID_SHARD);
                 s.mutable_sharding()->set_hybrid_shard_group_size(3);
               },
               "hybrid_shard_group_size 3 does not divide the world size 4"},
        BadJob{"hybrid_without_group",
               [](v1::JobSpec& s) { s.mutable_sharding()->set_strategy(v1::HYBRID_SHARD); },
               "hybrid_shard_group_size is required"},
        BadJob{"negative_lr", [](v1::JobSpec& s) { s.mutable_optimizer()->set_lr(-0.1); },
               "job.optimizer.lr must be a finite number >= 0, got -0.1"},
        BadJob{"bad_beta",
               [](v1::JobSpec& s) {
                 s.mutable_optimizer()->mutable_adamw()->set_beta1(1.5);
                 s.mutable_optimizer()->mutable_adamw()->set_beta2(0.9);
               },
               "job.optimizer.adamw: optimizer.beta1"},
        BadJob{"nesterov_without_momentum",
               [](v1::JobSpec& s) { s.mutable_optimizer()->mutable_sgd()->set_nesterov(true); },
               "job.optimizer.sgd"},
        BadJob{"negative_clip",
               [](v1::JobSpec& s) { s.mutable_optimizer()->set_max_grad_norm(-1); },
               "job.optimizer.max_grad_norm must be >= 0"},
        BadJob{"integer_param_dtype",
               [](v1::JobSpec& s) {
                 s.mutable_sharding()->mutable_mixed_precision()->set_param_dtype(v1::DTYPE_INT32);
               },
               "job.sharding.mixed_precision.param_dtype must be a floating dtype, got int32"},
        BadJob{"batch_not_divisible",
               [](v1::JobSpec& s) { s.mutable_data()->set_global_batch_size(30); },
               "job.data.global_batch_size 30 is not divisible by the world size 4"},
        BadJob{"zero_batch", [](v1::JobSpec& s) { s.mutable_data()->set_global_batch_size(0); },
               "job.data.global_batch_size must be > 0, got 0"},
        BadJob{"file_data_escapes",
               [](v1::JobSpec& s) {
                 s.mutable_data()->set_kind(v1::DataSpec::FILE);
                 s.mutable_data()->set_path("../../secrets");
               },
               "job.data.path must be relative"},
        BadJob{"unknown_wrap_type",
               [](v1::JobSpec& s) {
                 s.mutable_wrap_policy()->mutable_module_type()->set_module_types(0, "Block");
               },
               "unknown module type 'Block'"},
        BadJob{"rank_out_of_range",
               [](v1::JobSpec& s) { (*s.mutable_rank_by_worker_id())["w-1"] = 9; },
               "job.rank_by_worker_id[w-1] rank 9 is outside [0, 4)"},
        BadJob{"negative_restarts",
               [](v1::JobSpec& s) { s.mutable_recovery()->set_max_restarts(-1); },
               "job.recovery.max_restarts must be between 0 and 1000, got -1"},
        BadJob{"min_world_above_world",
               [](v1::JobSpec& s) { s.mutable_recovery()->set_min_world_size(5); },
               "job.recovery.min_world_size must be between 1 and the world size 4, got 5"},
        BadJob{"zero_min_world",
               [](v1::JobSpec& s) { s.mutable_recovery()->set_min_world_size(0); },
               "job.recovery.min_world_size must be between 1 and the world size 4, got 0"},
        BadJob{"nan_spare_wait",
               [](v1::JobSpec& s) { s.mutable_recovery()->set_spare_wait_s(std::nan("")); },
               "job.recovery.spare_wait_s must be between 0 and 3600 seconds"},
        BadJob{"negative_min_world_wait",
               [](v1::JobSpec& s) { s.mutable_recovery()->set_min_world_wait_s(-1); },
               "job.recovery.min_world_wait_s must be between 0 and 86400 seconds, got -1"},
        BadJob{"infinite_min_world_wait",
               [](v1::JobSpec& s) {
                 s.mutable_recovery()->set_min_world_wait_s(std::numeric_limits<double>::infinity());
               },
               "job.recovery.min_world_wait_s must be between 0 and 86400 seconds"},
        BadJob{"negative_in_memory_every_steps",
               [](v1::JobSpec& s) { s.mutable_checkpoints()->set_in_memory_every_steps(-2); },
               "job.checkpoints.in_memory_every_steps must be >= 0 (0: no in-memory peer "
               "snapshots), got -2"},
        BadJob{"negative_every_steps",
               [](v1::JobSpec& s) { s.mutable_checkpoints()->set_every_steps(-1); },
               "job.checkpoints.every_steps must be >= 0 (0: only on demand), got -1"},
        BadJob{"rank_given_twice",
               [](v1::JobSpec& s) {
                 auto& ranks = *s.mutable_rank_by_worker_id();
                 ranks["w-a"] = 0;
                 ranks["w-b"] = 1;
                 ranks["w-c"] = 1;
                 ranks["w-d"] = 3;
               },
               "job.rank_by_worker_id gives rank 1 to both w-b and w-c"},
        BadJob{"rank_missing",
               [](v1::JobSpec& s) {
                 auto& ranks = *s.mutable_rank_by_worker_id();
                 ranks["w-a"] = 0;
                 ranks["w-b"] = 2;
               },
               "job.rank_by_worker_id names 2 of the 4 ranks; missing rank(s) 1, 3"},
        BadJob{"tied_split_by_policy",
               [](v1::JobSpec& s) {
                 auto gpt = LoadModelSpecFile(testing_paths::Example("gpt-7m.yaml"));
                 *s.mutable_model() = ModelSpecToProto(*gpt);
                 s.mutable_wrap_policy()->mutable_module_type()->set_module_types(0, "Linear");
               },
               "tied parameters must be in one unit"}),
    [](const ::testing::TestParamInfo<BadJob>& param_info) {
      return std::string(param_info.param.name);
    });

}  // namespace
}  // namespace flatshard
