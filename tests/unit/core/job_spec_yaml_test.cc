// Tests core/job_spec_yaml.h: the demo job file reads into a JobSpec that
// JobConfigFromProto accepts, the model can be inline or a path relative to the
// job file, omitted fields keep the defaults job_config interprets, and each bad
// input is an error naming `file:line: field`.
#include "core/job_spec_yaml.h"

#include <cmath>
#include <filesystem>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "core/job_config.h"
#include "core/wrap_policy.h"
#include "core/wrap_policy_proto.h"
#include "core/yaml_fields.h"
#include "storage/spec_files.h"
#include "tests/unit/core/test_paths.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

std::string ExamplesDir() { return testing_paths::SourceDir() + "/examples"; }

void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

TEST(JobSpecYamlTest, ExampleJobLoadsAndValidates) {
  auto spec = LoadJobSpecFile(testing_paths::Example("mlp-job.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->name(), "mlp-demo");
  EXPECT_EQ(spec->world_size(), 4);
  EXPECT_EQ(spec->seed(), 0u);
  EXPECT_EQ(spec->model().name(), "mlp");
  EXPECT_EQ(spec->state_dict_settings().state_dict_type(), v1::FULL_STATE_DICT);
  EXPECT_TRUE(spec->state_dict_settings().state_dict_config().offload_to_cpu());
  EXPECT_TRUE(spec->state_dict_settings().optim_state_dict_config().rank0_only());
  EXPECT_EQ(spec->checkpoints().keep_last(), 3);

  auto job = JobConfigFromProto(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->world_size, 4);
  EXPECT_EQ(WrapPolicyToString(job->wrap_policy), "module-type:Residual");
  EXPECT_EQ(job->sharding.strategy, ShardingStrategy::kFullShard);
  EXPECT_EQ(job->sharding.backward_prefetch, BackwardPrefetch::kPre);
  EXPECT_TRUE(job->sharding.limit_all_gathers);
  EXPECT_EQ(job->sharding.param_dtype, DType::kBFloat16);
  EXPECT_EQ(job->sharding.reduce_dtype, DType::kFloat32);
  EXPECT_EQ(job->optimizer.kind, OptimizerKind::kAdamW);
  EXPECT_DOUBLE_EQ(job->optimizer.adam.lr, 0.003);
  EXPECT_DOUBLE_EQ(job->optimizer.adam.weight_decay, 0.01);
  EXPECT_EQ(job->data.kind, "regression");
  EXPECT_EQ(job->data.global_batch_size, 32);
  auto units = JobUnits(*job);
  ASSERT_TRUE(units.ok()) << units.status();
  EXPECT_EQ(units->size(), 5u);  // the root and one unit per Residual block
}

// docs/job-spec.md's full example is a valid job (its model path read against
// examples/), so the documentation cannot drift from the reader.
TEST(JobSpecYamlTest, DocumentedExampleIsValid) {
  auto doc = ReadTextFile(testing_paths::SourceDir() + "/docs/job-spec.md");
  ASSERT_TRUE(doc.ok()) << doc.status();
  const std::string heading = "## A complete example";
  const size_t section = doc->find(heading);
  ASSERT_NE(section, std::string::npos);
  const size_t begin = doc->find("```yaml\n", section);
  ASSERT_NE(begin, std::string::npos);
  const size_t end = doc->find("```", begin + 8);
  ASSERT_NE(end, std::string::npos);
  const std::string example = doc->substr(begin + 8, end - begin - 8);
  auto spec = ParseJobSpec(example, "docs/job-spec.md", ExamplesDir());
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto job = JobConfigFromProto(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->rank_by_worker_id.at("worker-d"), 3);
  EXPECT_DOUBLE_EQ(job->optimizer.max_grad_norm, 1.0);
}

TEST(JobSpecYamlTest, InlineModel) {
  const std::string text = R"(name: tiny
model:
  name: tiny
  root:
    type: Sequential
    children:
      - {name: fc, type: Linear, in_features: 4, out_features: 2}
world_size: 2
data: {global_batch_size: 4}
)";
  auto spec = ParseJobSpec(text, "tiny.yaml", "");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().root().children(0).type(), "Linear");
  auto job = JobConfigFromProto(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->model.root.children.at(0).params.size(), 2u);  // weight, bias
}

TEST(JobSpecYamlTest, RelativeModelPathResolvesAgainstTheJobFile) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "job_spec_yaml_test" / "jobs";
  WriteFile(dir / "models" / "tiny.yaml",
            "root: {type: Linear, in_features: 3, out_features: 3}\n");
  WriteFile(dir / "job.yaml", "name: rel\nmodel: models/tiny.yaml\nworld_size: 1\n");

  auto spec = LoadJobSpecFile((dir / "job.yaml").string());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->model().root().type(), "Linear");

  // The same text resolved elsewhere does not find the model.
  auto elsewhere = ParseJobSpec("model: models/tiny.yaml\n", "job.yaml", ExamplesDir());
  EXPECT_EQ(elsewhere.status().code(), absl::StatusCode::kNotFound);

  // An absolute path ignores base_dir.
  auto absolute = ParseJobSpec(absl::StrCat("model: ", (dir / "models" / "tiny.yaml").string()),
                               "job.yaml", "/nonexistent");
  EXPECT_TRUE(absolute.ok()) << absolute.status();
}

TEST(JobSpecYamlTest, OmittedFieldsKeepJobConfigDefaults) {
  auto spec =
      ParseJobSpec("name: m\nmodel: mlp.yaml\nworld_size: 2\ndata: {global_batch_size: 8}\n",
                   "m.yaml", ExamplesDir());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_FALSE(spec->has_sharding());
  EXPECT_FALSE(spec->sharding().has_limit_all_gathers());
  EXPECT_FALSE(spec->has_wrap_policy());
  // torch.optim's defaults, which the proto's zeros cannot say.
  EXPECT_TRUE(spec->optimizer().has_adamw());
  EXPECT_DOUBLE_EQ(spec->optimizer().lr(), 1e-3);
  EXPECT_DOUBLE_EQ(spec->optimizer().adamw().weight_decay(), 0.01);

  auto job = JobConfigFromProto(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->wrap_policy.kind, WrapPolicy::Kind::kNone);
  EXPECT_TRUE(job->sharding.limit_all_gathers);
  EXPECT_FALSE(job->sharding.param_dtype.has_value());
  EXPECT_EQ(job->optimizer.adam.beta1, 0.9);
  EXPECT_EQ(job->optimizer.adam.eps, 1e-8);
  EXPECT_EQ(job->optimizer.grad_norm_type, 2.0);
  EXPECT_EQ(job->data.kind, "regression");
  EXPECT_EQ(job->recovery.max_restarts, 3);
  EXPECT_EQ(job->recovery.min_world_size, 1);
  EXPECT_DOUBLE_EQ(job->recovery.spare_wait_s, 5.0);
  EXPECT_DOUBLE_EQ(job->recovery.min_world_wait_s, 600.0);
}

TEST(JobSpecYamlTest, EveryFieldReadsThrough) {
  const std::string text = R"(name: all
model: mlp.yaml
wrap_policy: size:1e5
world_size: 4
seed: 7
sharding:
  strategy: hybrid_shard
  hybrid_shard_group_size: 2
  backward_prefetch: BACKWARD_POST
  forward_prefetch: true
  limit_all_gathers: false
  use_orig_params: true
  mixed_precision: {param_dtype: bf16, reduce_dtype: fp32, buffer_dtype: float32,
                    keep_low_precision_grads: true}
  cpu_offload: true
  sync_module_states: true
optimizer:
  kind: sgd
  lr: 0.1
  momentum: 0.9
  dampening: 0.1
  weight_decay: 0.0001
  max_grad_norm: 1.0
  grad_norm_type: inf
data:
  kind: file
  global_batch_size: 8
  sequence_length: 16
  seed: 3
  path: train/x.npy
state_dict:
  type: SHARDED_STATE_DICT
  offload_to_cpu: true
  optim: {offload_to_cpu: false}
checkpoints: {every_steps: 10, keep_last: 2, async_save: true, in_memory_every_steps: 1}
rank_by_worker_id: {w-a: 1, w-b: 0, w-c: 3, w-d: 2}
recovery: {max_restarts: 5, min_world_size: 2, spare_wait_s: 1.5, min_world_wait_s: 90}
)";
  auto spec = ParseJobSpec(text, "all.yaml", ExamplesDir());
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->seed(), 7u);
  const v1::ShardingConfig& s = spec->sharding();
  EXPECT_EQ(s.strategy(), v1::HYBRID_SHARD);
  EXPECT_EQ(s.hybrid_shard_group_size(), 2);
  EXPECT_EQ(s.backward_prefetch(), v1::BACKWARD_POST);
  EXPECT_TRUE(s.forward_prefetch());
  EXPECT_TRUE(s.has_limit_all_gathers());
  EXPECT_FALSE(s.limit_all_gathers());
  EXPECT_TRUE(s.use_orig_params());
  EXPECT_EQ(s.mixed_precision().param_dtype(), v1::DTYPE_BFLOAT16);
  EXPECT_EQ(s.mixed_precision().reduce_dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(s.mixed_precision().buffer_dtype(), v1::DTYPE_FLOAT32);
  EXPECT_TRUE(s.mixed_precision().keep_low_precision_grads());
  EXPECT_TRUE(s.cpu_offload().offload_params());
  EXPECT_TRUE(s.sync_module_states());
  EXPECT_TRUE(spec->optimizer().has_sgd());
  EXPECT_DOUBLE_EQ(spec->optimizer().sgd().dampening(), 0.1);
  EXPECT_TRUE(std::isinf(spec->optimizer().grad_norm_type()));
  EXPECT_EQ(spec->data().kind(), v1::DataSpec::FILE);
  EXPECT_EQ(spec->data().path(), "train/x.npy");
  EXPECT_EQ(spec->data().sequence_length(), 16);
  EXPECT_EQ(spec->state_dict_settings().state_dict_type(), v1::SHARDED_STATE_DICT);
  EXPECT_TRUE(spec->state_dict_settings().state_dict_config().offload_to_cpu());
  EXPECT_FALSE(spec->state_dict_settings().optim_state_dict_config().offload_to_cpu());
  EXPECT_EQ(spec->checkpoints().every_steps(), 10);
  EXPECT_TRUE(spec->checkpoints().async_save());
  EXPECT_EQ(spec->checkpoints().in_memory_every_steps(), 1);
  EXPECT_EQ(spec->rank_by_worker_id().at("w-c"), 3);
  EXPECT_EQ(spec->recovery().max_restarts(), 5);

  auto job = JobConfigFromProto(*spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->recovery.max_restarts, 5);
  EXPECT_EQ(job->recovery.min_world_size, 2);
  EXPECT_DOUBLE_EQ(job->recovery.spare_wait_s, 1.5);
  EXPECT_DOUBLE_EQ(job->recovery.min_world_wait_s, 90.0);
  EXPECT_EQ(job->optimizer.kind, OptimizerKind::kSgd);
  EXPECT_DOUBLE_EQ(job->optimizer.sgd.lr, 0.1);
  EXPECT_EQ(job->wrap_policy.min_num_params, 100000);
  EXPECT_EQ(job->data.kind, "npy");
}

TEST(JobSpecYamlTest, AdamBetasAndEps) {
  auto spec = ParseJobSpec(
      "optimizer: {kind: adam, betas: [0.8, 0.99], eps: 1e-6, amsgrad: true}\n", "a.yaml", "");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_TRUE(spec->optimizer().has_adam());
  EXPECT_EQ(spec->optimizer().adam().beta1(), 0.8);
  EXPECT_EQ(spec->optimizer().adam().beta2(), 0.99);
  EXPECT_EQ(spec->optimizer().adam().eps(), 1e-6);
  EXPECT_TRUE(spec->optimizer().adam().amsgrad());
  EXPECT_EQ(spec->optimizer().adam().weight_decay(), 0.0);  // Adam's default, unlike AdamW
}

// The CLI's policy strings survive the trip through the wire form and job_config.
TEST(JobSpecYamlTest, WrapPolicyRoundTripsThroughTheProto) {
  for (const char* text :
       {"none", "always", "module-type:Linear,Residual", "size:100000", "fqn:blocks.0,blocks.2"}) {
    auto spec = ParseJobSpec(
        absl::StrCat("name: p\nmodel: mlp.yaml\nworld_size: 1\ndata: {global_batch_size: 1}\n",
                     "wrap_policy: ", text, "\n"),
        "p.yaml", ExamplesDir());
    ASSERT_TRUE(spec.ok()) << text << ": " << spec.status();
    auto job = JobConfigFromProto(*spec);
    ASSERT_TRUE(job.ok()) << text << ": " << job.status();
    EXPECT_EQ(WrapPolicyToString(job->wrap_policy), text);
    EXPECT_EQ(job->wrap_policy.force_leaf_module_types, WrapPolicy().force_leaf_module_types);
  }
  WrapPolicy custom = *ParseWrapPolicy("size:10");
  custom.exclude_module_types.clear();
  const v1::WrapPolicy proto = WrapPolicyToProto(custom);
  EXPECT_TRUE(proto.size_based().override_defaults());
  EXPECT_EQ(proto.size_based().exclude_module_types_size(), 0);
  EXPECT_EQ(proto.size_based().force_leaf_module_types(0), "MultiheadAttention");
}

struct BadFile {
  const char* name;
  const char* text;
  absl::StatusCode code;
  const char* expected;  // "file:line: field: problem" prefix
};

void PrintTo(const BadFile& bad, std::ostream* os) { *os << bad.name; }

class BadJobFileTest : public ::testing::TestWithParam<BadFile> {};

TEST_P(BadJobFileTest, NamesFileLineAndField) {
  auto spec = ParseJobSpec(GetParam().text, "bad.yaml", ExamplesDir());
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), GetParam().code) << spec.status();
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(GetParam().expected));
}

constexpr auto kInvalid = absl::StatusCode::kInvalidArgument;

INSTANTIATE_TEST_SUITE_P(
    JobSpecYaml, BadJobFileTest,
    ::testing::Values(
        BadFile{"unknown_top_key", "name: x\nmodle: mlp.yaml\n", kInvalid,
                "bad.yaml:2: modle: unknown field 'modle'"},
        BadFile{"unknown_nested_key", "sharding:\n  strategy: FULL_SHARD\n  prefetch: true\n",
                kInvalid, "bad.yaml:3: sharding.prefetch: unknown field 'prefetch'"},
        BadFile{"world_size_not_int", "name: x\nworld_size: four\n", kInvalid,
                "bad.yaml:2: world_size: expected an integer, got 'four'"},
        BadFile{"world_size_too_big", "world_size: 9999999999\n", kInvalid,
                "bad.yaml:1: world_size: 9999999999 does not fit in 32 bits"},
        BadFile{"negative_seed", "seed: -1\n", kInvalid, "bad.yaml:1: seed: must be >= 0"},
        BadFile{"unknown_strategy", "sharding:\n  strategy: FULL\n", kInvalid,
                "bad.yaml:2: sharding.strategy: unknown value 'FULL'; expected one of FULL_SHARD"},
        BadFile{"unknown_prefetch", "sharding:\n  backward_prefetch: PRE\n", kInvalid,
                "bad.yaml:2: sharding.backward_prefetch: unknown value 'PRE'"},
        BadFile{"bad_bool", "sharding:\n  cpu_offload: maybe\n", kInvalid,
                "bad.yaml:2: sharding.cpu_offload: expected true or false, got 'maybe'"},
        BadFile{"unknown_dtype", "sharding:\n  mixed_precision: {param_dtype: bfloat17}\n",
                kInvalid, "bad.yaml:2: sharding.mixed_precision.param_dtype: "},
        BadFile{"bad_wrap_policy", "wrap_policy: transformer\n", kInvalid,
                "bad.yaml:1: wrap_policy: unknown wrap policy 'transformer'"},
        BadFile{"wrap_policy_not_string", "wrap_policy: {module-type: Residual}\n", kInvalid,
                "bad.yaml:1: wrap_policy: expected a string, got a mapping"},
        BadFile{"unknown_optimizer", "optimizer:\n  kind: lamb\n", kInvalid,
                "bad.yaml:2: optimizer.kind: unknown value 'lamb'; expected one of sgd, adam"},
        BadFile{"sgd_key_on_adamw", "optimizer:\n  kind: adamw\n  momentum: 0.9\n", kInvalid,
                "bad.yaml:3: optimizer.momentum: applies only to kind: sgd"},
        BadFile{"adam_key_on_sgd", "optimizer:\n  kind: sgd\n  betas: [0.9, 0.99]\n", kInvalid,
                "bad.yaml:3: optimizer.betas: applies only to kind: adam or adamw"},
        BadFile{"three_betas", "optimizer:\n  betas: [0.9, 0.99, 0.5]\n", kInvalid,
                "bad.yaml:2: optimizer.betas: expected [beta1, beta2], got 3"},
        BadFile{"lr_not_number", "optimizer:\n  lr: fast\n", kInvalid,
                "bad.yaml:2: optimizer.lr: expected a number, got 'fast'"},
        BadFile{"unknown_data_kind", "data:\n  kind: images\n", kInvalid,
                "bad.yaml:2: data.kind: unknown value 'images'"},
        BadFile{"unknown_state_dict_type", "state_dict:\n  type: FULL\n", kInvalid,
                "bad.yaml:2: state_dict.type: unknown value 'FULL'"},
        BadFile{"checkpoints_not_map", "checkpoints: 5\n", kInvalid,
                "bad.yaml:1: checkpoints: expected a mapping, got a scalar"},
        BadFile{"rank_not_int", "rank_by_worker_id:\n  w-0: first\n", kInvalid,
                "bad.yaml:2: rank_by_worker_id.w-0: expected an integer"},
        BadFile{"missing_model_file", "name: x\nmodel: nope.yaml\n", absl::StatusCode::kNotFound,
                "bad.yaml:2: model: "},
        BadFile{"model_is_list", "model: [mlp.yaml]\n", kInvalid,
                "bad.yaml:1: model: expected a model file path or an inline model mapping"},
        BadFile{"inline_model_error", "name: x\nmodel:\n  root:\n    type: Linearr\n", kInvalid,
                "bad.yaml:4: model.root.type: unknown module type 'Linearr'"},
        BadFile{"yaml_syntax", "name: x\nsharding: [oops\n", kInvalid, "bad.yaml:"}),
    [](const ::testing::TestParamInfo<BadFile>& param_info) { return param_info.param.name; });

TEST(JobSpecYamlTest, MissingModelFileNamesThePath) {
  auto spec = ParseJobSpec("model: nope.yaml\n", "bad.yaml", ExamplesDir());
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("examples/nope.yaml"));
  EXPECT_EQ(LoadJobSpecFile("/nonexistent/job.yaml").status().code(), absl::StatusCode::kNotFound);
}

// An error inside a referenced model file names that file too.
TEST(JobSpecYamlTest, ErrorInsideModelFileNamesBothFiles) {
  const std::filesystem::path dir =
      std::filesystem::path(::testing::TempDir()) / "job_spec_yaml_test" / "broken";
  WriteFile(dir / "m.yaml", "root:\n  type: Linear\n  in_features: x\n");
  auto spec = ParseJobSpec("name: j\nmodel: m.yaml\n", "job.yaml", dir.string());
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("job.yaml:2: model: "));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr("m.yaml:3: root.in_features"));
}

}  // namespace
}  // namespace flatshard
