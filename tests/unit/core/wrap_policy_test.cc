// Tests core/wrap_policy.h against docs/fsdp-semantics.md §9.1: _recursive_wrap with the
// size-based policy (remainders, force-leaf, exclude), ModuleWrapPolicy on the GPT
// example, explicit FQNs, always, and tied parameters across units (§1.1).
#include "core/wrap_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/model_spec_yaml.h"
#include "storage/spec_files.h"
#include "tests/unit/core/test_paths.h"

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// root (296 params): a Linear(10,10)=110; b {scale[40], b1 Linear(10,10)=110,
// b2 Linear(5,5)=30}; c Linear(2,2)=6.
constexpr char kNested[] = R"(
name: nested
root:
  type: Sequential
  children:
    - {name: a, type: Linear, in_features: 10, out_features: 10}
    - name: b
      type: B_TYPE
      params: [{name: scale, shape: [40]}]
      children:
        - {name: b1, type: Linear, in_features: 10, out_features: 10}
        - {name: b2, type: Linear, in_features: 5, out_features: 5}
    - {name: c, type: Linear, in_features: 2, out_features: 2}
)";

struct Units {
  ModelSpec spec;
  std::vector<Unit> units;
};

Units Cut(const std::string& yaml, const WrapPolicy& policy) {
  auto spec = ParseModelSpec(yaml, "test.yaml");
  EXPECT_TRUE(spec.ok()) << spec.status();
  Units out{*std::move(spec), {}};
  auto index = IndexModel(out.spec);
  EXPECT_TRUE(index.ok()) << index.status();
  auto units = ComputeUnits(*index, policy);
  EXPECT_TRUE(units.ok()) << units.status();
  if (units.ok()) out.units = *std::move(units);
  return out;
}

std::string WithBType(const std::string& type) {
  std::string yaml = kNested;
  yaml.replace(yaml.find("B_TYPE"), 6, type);
  return yaml;
}

std::vector<std::string> Fqns(const Unit& unit) {
  std::vector<std::string> fqns;
  for (const UnitParam& p : unit.params) fqns.push_back(p.fqn);
  return fqns;
}

WrapPolicy SizeBased(int64_t min_num_params) {
  WrapPolicy policy;
  policy.kind = WrapPolicy::Kind::kSizeBased;
  policy.min_num_params = min_num_params;
  return policy;
}

// min 100: a (110) wraps; b's remainder after b1 is 70 < 100, so b does not and
// its scale and b2 fall to the root with c.
TEST(SizeBasedWrapTest, RemainderBelowThresholdFallsToTheParent) {
  Units cut = Cut(WithBType("Module"), SizeBased(100));
  ASSERT_EQ(cut.units.size(), 3u);
  EXPECT_EQ(cut.units[0].module_fqn, "");
  EXPECT_TRUE(cut.units[0].is_root);
  EXPECT_THAT(Fqns(cut.units[0]),
              ElementsAre("b.scale", "b.b2.weight", "b.b2.bias", "c.weight", "c.bias"));
  EXPECT_EQ(cut.units[0].numel, 40 + 30 + 6);
  EXPECT_EQ(cut.units[1].module_fqn, "a");
  EXPECT_EQ(cut.units[2].module_fqn, "b.b1");
  EXPECT_EQ(cut.units[2].numel, 110);
}

// min 60: b's remainder (70) is large enough, so b wraps scale and b2.
TEST(SizeBasedWrapTest, RemainderAboveThresholdWrapsTheParent) {
  Units cut = Cut(WithBType("Module"), SizeBased(60));
  ASSERT_EQ(cut.units.size(), 4u);
  EXPECT_THAT(Fqns(cut.units[0]), ElementsAre("c.weight", "c.bias"));
  EXPECT_EQ(cut.units[1].module_fqn, "a");
  EXPECT_EQ(cut.units[2].module_fqn, "b");
  EXPECT_THAT(Fqns(cut.units[2]), ElementsAre("b.scale", "b.b2.weight", "b.b2.bias"));
  EXPECT_EQ(cut.units[3].module_fqn, "b.b1");
}

// exclude_wrap_modules (default ModuleList, ModuleDict): recursed into, never wrapped.
TEST(SizeBasedWrapTest, ExcludedTypesAreNotWrapped) {
  Units cut = Cut(WithBType("ModuleList"), SizeBased(60));
  ASSERT_EQ(cut.units.size(), 3u);
  EXPECT_THAT(Fqns(cut.units[0]),
              ElementsAre("b.scale", "b.b2.weight", "b.b2.bias", "c.weight", "c.bias"));
  EXPECT_EQ(cut.units[2].module_fqn, "b.b1");
}

// force_leaf_modules: _recursive_wrap does not recurse into them, and returns
// (module, 0) without wrapping, so their params go to the parent.
TEST(SizeBasedWrapTest, ForceLeafModulesAreNotEnteredOrWrapped) {
  WrapPolicy policy = SizeBased(60);
  policy.force_leaf_module_types = {"Module"};
  Units cut = Cut(WithBType("Module"), policy);
  ASSERT_EQ(cut.units.size(), 2u);
  EXPECT_EQ(cut.units[1].module_fqn, "a");
  EXPECT_EQ(cut.units[0].numel, 40 + 110 + 30 + 6);
}

TEST(SizeBasedWrapTest, HugeThresholdLeavesOnlyTheRoot) {
  Units cut = Cut(WithBType("Module"), SizeBased(100000000));
  ASSERT_EQ(cut.units.size(), 1u);
  EXPECT_EQ(cut.units[0].numel, 296);
}

// ModuleWrapPolicy on the GPT example: one unit per block plus the root, which
// keeps wte, wpe, ln_f and stores the tied lm_head.weight once.
TEST(ModuleTypeWrapTest, GptExampleOneUnitPerBlockPlusRoot) {
  auto spec = LoadModelSpecFile(testing_paths::Example("gpt-7m.yaml"));
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto index = IndexModel(*spec);
  ASSERT_TRUE(index.ok());
  WrapPolicy policy;
  policy.kind = WrapPolicy::Kind::kModuleType;
  policy.module_types = {"TransformerBlock"};
  auto units = ComputeUnits(*index, policy);
  ASSERT_TRUE(units.ok()) << units.status();
  ASSERT_EQ(units->size(), 9u);
  const Unit& root = units->front();
  EXPECT_TRUE(root.is_root);
  EXPECT_THAT(Fqns(root), ElementsAre("wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"));
  ASSERT_EQ(root.shared.size(), 1u);
  EXPECT_EQ(root.shared[0].fqn, "lm_head.weight");
  EXPECT_EQ(root.shared[0].primary_fqn, "wte.weight");
  for (int b = 0; b < 8; ++b) {
    const Unit& unit = (*units)[static_cast<size_t>(b) + 1];
    EXPECT_EQ(unit.module_fqn, "h." + std::to_string(b));
    EXPECT_EQ(unit.index, b + 1);
    EXPECT_EQ(unit.params.size(), 12u);
    EXPECT_EQ(unit.params.front().fqn, "h." + std::to_string(b) + ".ln_1.weight");
  }
  // Every parameter element lands in exactly one unit; the tie counts once.
  int64_t total = 0;
  for (const Unit& unit : *units) total += unit.numel;
  EXPECT_EQ(total, index->TotalNumel());
}

// Tied parameters must share a unit (docs/fsdp-semantics.md §9.1): wrapping lm_head (a Linear)
// on its own would split it from wte.
TEST(ModuleTypeWrapTest, TiedParametersSplitAcrossUnitsAreAnError) {
  auto spec = LoadModelSpecFile(testing_paths::Example("gpt-7m.yaml"));
  ASSERT_TRUE(spec.ok());
  auto index = IndexModel(*spec);
  ASSERT_TRUE(index.ok());
  WrapPolicy policy;
  policy.kind = WrapPolicy::Kind::kModuleType;
  policy.module_types = {"Linear"};
  auto units = ComputeUnits(*index, policy);
  EXPECT_EQ(units.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(units.status().message()),
              HasSubstr("tied parameters must be in one unit: 'lm_head.weight' falls in the "
                        "unit of 'lm_head' but its primary 'wte.weight' falls in the root unit"));
}

TEST(ExplicitAndAlwaysWrapTest, CutsWhereAsked) {
  WrapPolicy fqns;
  fqns.kind = WrapPolicy::Kind::kExplicitFqns;
  fqns.module_fqns = {"b"};
  Units cut = Cut(WithBType("Module"), fqns);
  ASSERT_EQ(cut.units.size(), 2u);
  EXPECT_THAT(Fqns(cut.units[1]),
              ElementsAre("b.scale", "b.b1.weight", "b.b1.bias", "b.b2.weight", "b.b2.bias"));

  WrapPolicy always;
  always.kind = WrapPolicy::Kind::kAlways;
  cut = Cut(WithBType("Module"), always);
  // Sequential root has no params of its own and is dropped; 5 modules own params.
  ASSERT_EQ(cut.units.size(), 5u);
  EXPECT_EQ(cut.units[0].module_fqn, "a");
  EXPECT_FALSE(cut.units[0].is_root);
  EXPECT_THAT(Fqns(cut.units[1]), ElementsAre("b.scale"));
}

TEST(WrapPolicyTest, ParsesTheCliForm) {
  EXPECT_EQ(ParseWrapPolicy("size:1e6")->min_num_params, 1000000);
  EXPECT_EQ(ParseWrapPolicy("size:1_000")->min_num_params, 1000);
  EXPECT_EQ(ParseWrapPolicy("module-type:A,B")->module_types.size(), 2u);
  EXPECT_EQ(ParseWrapPolicy("fqn:h.0,h.1")->module_fqns.size(), 2u);
  EXPECT_EQ(ParseWrapPolicy("always")->kind, WrapPolicy::Kind::kAlways);
  EXPECT_EQ(WrapPolicyToString(*ParseWrapPolicy("module-type:TransformerBlock")),
            "module-type:TransformerBlock");
  EXPECT_THAT(std::string(ParseWrapPolicy("size:0").status().message()),
              HasSubstr("min_num_params must be a positive integer, got '0'"));
  EXPECT_THAT(std::string(ParseWrapPolicy("size:1.5").status().message()),
              HasSubstr("positive integer"));
  EXPECT_THAT(std::string(ParseWrapPolicy("module-type:").status().message()),
              HasSubstr("needs at least one type"));
  EXPECT_THAT(std::string(ParseWrapPolicy("transformer").status().message()),
              HasSubstr("unknown wrap policy 'transformer'"));
}

TEST(WrapPolicyTest, PolicyErrorsNameTheField) {
  auto spec = ParseModelSpec(WithBType("Module"), "t.yaml");
  ASSERT_TRUE(spec.ok());
  auto index = IndexModel(*spec);
  ASSERT_TRUE(index.ok());
  WrapPolicy policy;
  policy.kind = WrapPolicy::Kind::kModuleType;
  policy.module_types = {"TransfomerBlock"};
  EXPECT_THAT(std::string(ComputeUnits(*index, policy).status().message()),
              HasSubstr("wrap_policy.module_types: unknown module type 'TransfomerBlock'"));
  policy = SizeBased(0);
  EXPECT_THAT(std::string(ComputeUnits(*index, policy).status().message()),
              HasSubstr("wrap_policy.min_num_params must be > 0, got 0"));
  policy.kind = WrapPolicy::Kind::kExplicitFqns;
  policy.module_fqns = {"b.b9"};
  EXPECT_THAT(std::string(ComputeUnits(*index, policy).status().message()),
              HasSubstr("wrap_policy.module_fqns: 'b.b9' is not a module of the model"));
}

}  // namespace
}  // namespace flatshard
