// Tests core/model_spec_yaml.h, core/model_spec.h and core/model_spec_proto.h: the
// examples parse, FQNs follow PyTorch, JSON works like YAML, proto round-trips,
// and bad specs fail with the file, the line, the field and the problem
// (docs/fsdp-semantics.md §10's spec-level errors among them).
#include "core/model_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/model_spec_proto.h"
#include "core/model_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/unit/core/test_paths.h"

namespace flatshard {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

TEST(ModelSpecTest, ExamplesParseWithPyTorchFqns) {
  auto gpt = LoadModelSpecFile(testing_paths::Example("gpt-7m.yaml"));
  ASSERT_TRUE(gpt.ok()) << gpt.status();
  auto index = IndexModel(*gpt);
  ASSERT_TRUE(index.ok());
  EXPECT_TRUE(index->param_by_fqn.contains("h.3.mlp.c_fc.weight"));
  EXPECT_TRUE(index->module_by_fqn.contains("h.7.attn.c_attn"));
  const IndexedParam& head =
      index->params[static_cast<size_t>(index->param_by_fqn.at("lm_head.weight"))];
  EXPECT_EQ(index->params[static_cast<size_t>(head.primary)].fqn, "wte.weight");
  // wte is 4096x256 and counted once although lm_head aliases it.
  int64_t with_alias = 0;
  for (const IndexedParam& p : index->params) with_alias += NumElements(p.spec->shape);
  EXPECT_EQ(with_alias - index->TotalNumel(), 4096 * 256);

  auto mlp = LoadModelSpecFile(testing_paths::Example("mlp.yaml"));
  ASSERT_TRUE(mlp.ok()) << mlp.status();
  auto mlp_index = IndexModel(*mlp);
  ASSERT_TRUE(mlp_index.ok());
  EXPECT_GE(mlp_index->TotalNumel(), 1000000);
  EXPECT_EQ(mlp_index->params.front().fqn, "input.weight");
  EXPECT_TRUE(mlp_index->param_by_fqn.contains("blocks.3.fc2.bias"));
}

TEST(ModelSpecTest, JsonParsesLikeYaml) {
  auto spec = ParseModelSpec(
      R"({"model": {"name": "tiny", "root": {"type": "Sequential", "children": [
            {"name": "fc", "type": "Linear", "in_features": 3, "out_features": 2,
             "bias": false}]}}})",
      "tiny.json");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->root.children.size(), 1u);
  ASSERT_EQ(spec->root.children[0].params.size(), 1u);
  EXPECT_EQ(spec->root.children[0].params[0].shape, (std::vector<int64_t>{2, 3}));
}

TEST(ModelSpecTest, ProtoRoundTrip) {
  auto spec = LoadModelSpecFile(testing_paths::Example("gpt-7m.yaml"));
  ASSERT_TRUE(spec.ok());
  v1::ModelSpec proto = ModelSpecToProto(*spec);
  auto back = ModelSpecFromProto(proto);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ModelSpecToProto(*back).SerializeAsString(), proto.SerializeAsString());
  EXPECT_EQ(back->tied.size(), 1u);

  v1::ModelSpec bad = proto;
  bad.mutable_root()->mutable_children(0)->mutable_params(0)->set_dtype(static_cast<v1::DType>(99));
  EXPECT_THAT(std::string(ModelSpecFromProto(bad).status().message()),
              HasSubstr("model.root.children[0].params[0].dtype: unknown dtype value 99"));
  v1::ModelSpec rootless;
  EXPECT_THAT(std::string(ModelSpecFromProto(rootless).status().message()),
              HasSubstr("model.root"));
  v1::ModelSpec dup = proto;
  *dup.mutable_root()->add_children() = proto.root().children(0);
  EXPECT_THAT(std::string(ModelSpecFromProto(dup).status().message()),
              HasSubstr("duplicate FQN 'wte'"));
}

struct BadSpec {
  const char* name;
  const char* yaml;
  const char* expected;  // substring of the message, after "bad.yaml:"
};

void PrintTo(const BadSpec& spec, std::ostream* os) { *os << spec.name; }

// Each bad spec must fail with INVALID_ARGUMENT and a message that starts with the
// file name and names the field or parameter and the problem.
class BadSpecTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(BadSpecTest, FailsWithFileFieldAndProblem) {
  auto spec = ParseModelSpec(GetParam().yaml, "bad.yaml");
  ASSERT_FALSE(spec.ok()) << GetParam().name;
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(spec.status().message()), StartsWith("bad.yaml:"));
  EXPECT_THAT(std::string(spec.status().message()), HasSubstr(GetParam().expected));
}

INSTANTIATE_TEST_SUITE_P(
    AllKinds, BadSpecTest,
    ::testing::Values(
        BadSpec{"yaml_syntax", "root: {type: Linear\n  bad: [", "bad.yaml:"},
        BadSpec{"unknown_field",
                "root:\n  type: Sequential\n  children:\n    - {name: fc, type: Linear, "
                "in_feature: 3, out_features: 2}\n",
                "4: root.children[0].in_feature: unknown field 'in_feature'"},
        BadSpec{"unknown_type",
                "root:\n  type: Sequential\n  children:\n    - {name: fc, type: Conv9d}\n",
                "root.children[0].type: unknown module type 'Conv9d'; known types:"},
        BadSpec{"duplicate_fqn",
                "root:\n  type: Sequential\n  children:\n"
                "    - {name: fc, type: Linear, in_features: 2, out_features: 2}\n"
                "    - {name: fc, type: Linear, in_features: 2, out_features: 2}\n",
                "5: duplicate FQN 'fc'"},
        BadSpec{"duplicate_param",
                "root:\n  type: Module\n  params:\n    - {name: w, shape: [2]}\n"
                "    - {name: w, shape: [3]}\n",
                "5: duplicate parameter FQN 'w'"},
        BadSpec{"negative_dim",
                "root:\n  type: Module\n  children:\n    - name: blk\n      type: Module\n"
                "      params: [{name: w, shape: [3, -4]}]\n",
                "parameter 'blk.w': shape[1] must be > 0, got -4"},
        BadSpec{"layer_norm_width_not_a_number",
                "root:\n  type: LayerNorm\n  attrs: {normalized_shape: wide}\n",
                "LayerNorm attrs.normalized_shape must be an integer > 0, got 'wide'"},
        BadSpec{"layer_norm_width_against_weight",
                "root:\n  type: LayerNorm\n  params: [{name: weight, shape: [6]}]\n"
                "  attrs: {normalized_shape: '8'}\n",
                "LayerNorm attrs.normalized_shape 8 does not match weight [6]"},
        BadSpec{"linear_overflows",
                "root:\n  type: Sequential\n  children:\n"
                "    - {name: fc, type: Linear, in_features: 4000000000, "
                "out_features: 4000000000}\n",
                "parameter 'fc.weight' has more than 1099511627776 elements (shape "
                "[4000000000, 4000000000])"},
        BadSpec{"model_too_large",
                "root:\n  type: Module\n  params:\n"
                "    - {name: a, shape: [1099511627776]}\n"
                "    - {name: b, shape: [1099511627776]}\n"
                "    - {name: c, shape: [1099511627776]}\n"
                "    - {name: d, shape: [1099511627776]}\n"
                "    - {name: e, shape: [1099511627776]}\n"
                "    - {name: f, shape: [1099511627776]}\n"
                "    - {name: g, shape: [1099511627776]}\n"
                "    - {name: h, shape: [1099511627776]}\n"
                "    - {name: i, shape: [1099511627776]}\n"
                "    - {name: j, shape: [1099511627776]}\n"
                "    - {name: k, shape: [1099511627776]}\n"
                "    - {name: l, shape: [1099511627776]}\n"
                "    - {name: m, shape: [1099511627776]}\n"
                "    - {name: n, shape: [1099511627776]}\n"
                "    - {name: o, shape: [1099511627776]}\n"
                "    - {name: p, shape: [1099511627776]}\n"
                "    - {name: q, shape: [1]}\n",
                "the model has more than 17592186044416 elements by parameter 'q'"},
        BadSpec{"shape_not_int", "root:\n  type: Module\n  params: [{name: w, shape: [3, big]}]\n",
                "root.params[0].shape[1]: expected an integer, got 'big'"},
        BadSpec{"integer_trainable",
                "root:\n  type: Module\n  params: [{name: ids, shape: [4], dtype: int32}]\n",
                "parameter 'ids' has dtype int32; only floating dtypes can be trained"},
        BadSpec{"unknown_dtype",
                "root:\n  type: Module\n  params: [{name: w, shape: [4], dtype: float8}]\n",
                "root.params[0].dtype: unknown dtype 'float8'"},
        BadSpec{"tie_points_nowhere",
                "root:\n  type: Module\n  params: [{name: w, shape: [4]}, {name: v, shape: "
                "[4]}]\ntied:\n  - {alias: v, primary: emb.weight}\n",
                "tied parameter 'v' points nowhere: primary 'emb.weight' is not a parameter"},
        BadSpec{"tie_alias_missing",
                "root:\n  type: Module\n  params: [{name: w, shape: [4]}]\ntied:\n"
                "  - {alias: head.weight, primary: w}\n",
                "tied.alias 'head.weight' is not a parameter of the model"},
        BadSpec{"tie_shape_mismatch",
                "root:\n  type: Module\n  params: [{name: w, shape: [4]}, {name: v, shape: "
                "[5]}]\ntied:\n  - {alias: v, primary: w}\n",
                "tied parameter 'v' [5] float32 does not match its primary 'w' [4] float32"},
        BadSpec{"linear_bias_mismatch",
                "root:\n  type: Sequential\n  children:\n    - name: fc\n      type: Linear\n"
                "      params: [{name: weight, shape: [3, 2]}, {name: bias, shape: [2]}]\n",
                "module 'fc' (Linear): Linear bias must be [3] to match weight [3, 2], got [2]"},
        BadSpec{"activation_with_params",
                "root:\n  type: Sequential\n  children:\n    - name: act\n      type: ReLU\n"
                "      params: [{name: w, shape: [2]}]\n",
                "module 'act' (ReLU): ReLU has no parameters, found 'w'"},
        BadSpec{"empty_model",
                "root:\n  type: Sequential\n  children:\n    - {name: act, type: ReLU}\n",
                "model has no parameters"},
        BadSpec{"missing_root", "name: nothing\n", "document: 'root' (the top module) is required"},
        BadSpec{"missing_child_name",
                "root:\n  type: Sequential\n  children:\n    - {type: ReLU}\n",
                "root.children[0]: 'name' is required"},
        BadSpec{"repeat_without_template",
                "root:\n  type: Sequential\n  children:\n    - {name: layers, repeat: 3}\n",
                "root.children[0]: 'repeat' and 'template' go together"},
        BadSpec{"repeat_zero",
                "root:\n  type: Sequential\n  children:\n    - name: layers\n      repeat: 0\n"
                "      template: {type: ReLU}\n",
                "root.children[0].repeat: must be between 1 and"},
        BadSpec{"shorthand_and_params",
                "root:\n  type: Sequential\n  children:\n    - name: fc\n      type: Linear\n"
                "      in_features: 2\n      params: [{name: weight, shape: [2, 2]}]\n",
                "give either 'params' or the Linear shorthand settings, not both"},
        BadSpec{"shorthand_missing_key",
                "root:\n  type: Sequential\n  children:\n"
                "    - {name: fc, type: Linear, in_features: 2}\n",
                "root.children[0]: 'out_features' is required with the shorthand form"},
        BadSpec{"bad_name",
                "root:\n  type: Sequential\n  children:\n"
                "    - {name: my.fc, type: Linear, in_features: 2, out_features: 2}\n",
                "child name 'my.fc' must be non-empty and use only letters"},
        BadSpec{"bad_init",
                "root:\n  type: Module\n  params: [{name: w, shape: [2], init: {kind: normal, "
                "std: -1}}]\n",
                "parameter 'w': init.std must be > 0, got -1"}),
    [](const ::testing::TestParamInfo<BadSpec>& param_info) {
      return std::string(param_info.param.name);
    });

TEST(ModelSpecTest, MissingFileIsNotFoundNamingThePath) {
  auto spec = LoadModelSpecFile("/nonexistent/model.yaml");
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("/nonexistent/model.yaml: cannot open"));
}

// A LayerNorm without affine parameters keeps its width where the workers and
// a client rebuilding the torch module find it: attrs.normalized_shape, also
// on the wire.
TEST(ModelSpecTest, LayerNormWithoutAffineKeepsItsWidthInAttrs) {
  auto spec = ParseModelSpec(
      "root:\n  type: Sequential\n  children:\n"
      "    - {name: plain, type: LayerNorm, normalized_shape: 6, elementwise_affine: false}\n"
      "    - {name: affine, type: LayerNorm, normalized_shape: 6}\n",
      "ln.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModuleSpec& plain = spec->root.children[0];
  EXPECT_TRUE(plain.params.empty());
  EXPECT_THAT(plain.attrs, ::testing::ElementsAre(::testing::Pair("normalized_shape", "6")));
  const ModuleSpec& affine = spec->root.children[1];
  EXPECT_EQ(affine.params.size(), 2u);
  EXPECT_TRUE(affine.attrs.empty());  // the weight's shape says it
  auto round_trip = ModelSpecFromProto(ModelSpecToProto(*spec));
  ASSERT_TRUE(round_trip.ok()) << round_trip.status();
  EXPECT_EQ(round_trip->root.children[0].attrs.at("normalized_shape"), "6");
}

TEST(ModelSpecTest, RepeatMakesPyTorchStyleIndexedChildren) {
  auto spec = ParseModelSpec(
      "root:\n  type: Sequential\n  children:\n    - name: layers\n      repeat: 3\n"
      "      template: {type: Linear, in_features: 4, out_features: 4}\n",
      "r.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModuleSpec& layers = spec->root.children[0];
  EXPECT_EQ(layers.type, "ModuleList");
  ASSERT_EQ(layers.children.size(), 3u);
  EXPECT_EQ(layers.children[2].name, "2");
  auto index = IndexModel(*spec);
  ASSERT_TRUE(index.ok());
  EXPECT_TRUE(index->param_by_fqn.contains("layers.2.bias"));
}

// A document's size does not bound what it expands to: it is counted as the
// tree is built, and one past the bound fails before it is allocated (10^10
// modules here, which would take the coordinator's memory long before).
TEST(ModelSpecTest, NestedRepeatsPastTheBoundFailBeforeTheyAreBuilt) {
  auto spec = ParseModelSpec(
      "root: {repeat: 100000, template: {repeat: 100000, template: {type: ReLU}}}\n", "r.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_THAT(std::string(spec.status().message()),
              AllOf(StartsWith("r.yaml:1"), HasSubstr("root.repeat"),
                    HasSubstr("100000 copies of a template of 100001 entries")));
}

// A repeated template copies its attributes' strings (and its parameters'
// shapes): they count by size, so a few KB repeated 100,000 times fail too.
TEST(ModelSpecTest, RepeatedAttributesCountByTheirSize) {
  auto spec = ParseModelSpec(absl::StrCat("root: {repeat: 100000, template: {type: ReLU, attrs: "
                                          "{note: '",
                                          std::string(2000, 'x'), "'}}}\n"),
                             "r.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  // The module, its attribute, and 31 pieces of 64 bytes of its value.
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("100000 copies of a template of 33 entries"));
  auto shapes = ParseModelSpec(
      absl::StrCat("root: {repeat: 100000, template: {type: Linear, params: [{name: w, shape: [",
                   absl::StrJoin(std::vector<int>(20, 1), ", "), "]}]}}\n"),
      "s.yaml");
  ASSERT_EQ(shapes.status().code(), absl::StatusCode::kInvalidArgument) << shapes.status();
  EXPECT_THAT(std::string(shapes.status().message()),
              HasSubstr("100000 copies of a template of 22 entries"));
}

// YAML aliases multiply the same way: each level lists the one before ten
// times, so seven levels are 10^7 modules from a few hundred bytes.
TEST(ModelSpecTest, AliasedModulesPastTheBoundFailAsTheyAreRead) {
  std::string text = "root:\n  type: Sequential\n  children:\n    - &l0 {name: r, type: ReLU}\n";
  for (int level = 1; level <= 7; ++level) {
    text += absl::StrCat("    - &l", level, " {name: s", level, ", type: Sequential, children: [");
    for (int i = 0; i < 10; ++i) text += absl::StrCat(i == 0 ? "" : ", ", "*l", level - 1);
    text += "]}\n";
  }
  auto spec = ParseModelSpec(text, "a.yaml");
  ASSERT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << spec.status();
  EXPECT_THAT(std::string(spec.status().message()),
              HasSubstr("the model expands to more than 1000000 entries"));
}

// Within the bound, a repeat of a repeat is read as before.
TEST(ModelSpecTest, NestedRepeatsWithinTheBoundAreRead) {
  auto spec = ParseModelSpec(
      "root:\n  type: Sequential\n  children:\n    - name: blocks\n      repeat: 300\n"
      "      template:\n        repeat: 3\n"
      "        template: {type: Linear, in_features: 2, out_features: 2}\n",
      "r.yaml");
  ASSERT_TRUE(spec.ok()) << spec.status();
  const ModuleSpec& blocks = spec->root.children[0];
  ASSERT_EQ(blocks.children.size(), 300u);
  EXPECT_EQ(blocks.children[299].name, "299");
  ASSERT_EQ(blocks.children[299].children.size(), 3u);
  EXPECT_EQ(blocks.children[299].children[2].name, "2");
  auto index = IndexModel(*spec);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_TRUE(index->param_by_fqn.contains("blocks.299.2.weight"));
}

}  // namespace
}  // namespace flatshard
