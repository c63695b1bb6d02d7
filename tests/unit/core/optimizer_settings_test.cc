// Tests the job-level optimizer vocabulary in core/optimizer.h: one
// OptimizerKind with its names, the states each setting keeps (what the plan
// charges and the checkpoint manifest lists), validation by kind, and the
// step dispatched by kind (AdamW is Adam with decoupled weight decay).
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/optimizer.h"

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(OptimizerKindTest, NamesRoundTrip) {
  for (OptimizerKind kind : {OptimizerKind::kSgd, OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    auto parsed = ParseOptimizerKind(OptimizerKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_EQ(OptimizerKindName(OptimizerKind::kAdamW), "adamw");
  auto unknown = ParseOptimizerKind("sgd-momentum");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unknown.status().message()),
              HasSubstr("unknown optimizer 'sgd-momentum'; expected sgd, adam or adamw"));
}

TEST(OptimizerSettingsTest, StatesFollowTheKindAndOptions) {
  OptimizerSettings s;
  s.kind = OptimizerKind::kSgd;
  EXPECT_THAT(OptimizerStateNames(s), IsEmpty());
  s.sgd.momentum = 0.9;
  EXPECT_THAT(OptimizerStateNames(s), ElementsAre("momentum_buffer"));
  EXPECT_EQ(OptimizerStatesPerElement(s), 1);
  s.kind = OptimizerKind::kAdamW;
  EXPECT_THAT(OptimizerStateNames(s), ElementsAre("exp_avg", "exp_avg_sq"));
  s.adam.amsgrad = true;
  EXPECT_THAT(OptimizerStateNames(s), ElementsAre("exp_avg", "exp_avg_sq", "max_exp_avg_sq"));
  EXPECT_EQ(OptimizerStatesPerElement(s), 3);
}

TEST(OptimizerSettingsTest, ValidatesTheOptionsOfItsKind) {
  OptimizerSettings s;
  s.kind = OptimizerKind::kSgd;
  s.adam.beta1 = 2.0;  // not used by SGD
  EXPECT_TRUE(ValidateOptimizerSettings(s).ok());
  s.kind = OptimizerKind::kAdam;
  EXPECT_THAT(std::string(ValidateOptimizerSettings(s).message()), HasSubstr("beta1"));
}

TEST(OptimizerSettingsTest, StepDispatchesByKind) {
  const std::vector<float> grads = {0.5f, -1.0f, 2.0f};
  OptimizerSettings adamw;
  adamw.kind = OptimizerKind::kAdamW;
  adamw.adam.lr = 0.1;
  adamw.adam.weight_decay = 0.01;
  std::vector<float> via_settings = {1.0f, 2.0f, 3.0f};
  auto state = MakeOptimizerState(adamw.kind, via_settings.size());
  ASSERT_TRUE(OptimizerStep(adamw, via_settings, grads, *state).ok());

  AdamOptions direct_options = adamw.adam;
  direct_options.decoupled_weight_decay = true;
  std::vector<float> direct = {1.0f, 2.0f, 3.0f};
  AdamState direct_state(direct.size());
  ASSERT_TRUE(AdamStep(direct, grads, direct_state, direct_options).ok());
  EXPECT_EQ(via_settings, direct);

  OptimizerSettings sgd;
  sgd.kind = OptimizerKind::kSgd;
  sgd.sgd.lr = 0.1;
  std::vector<float> params = {1.0f, 2.0f, 3.0f};
  EXPECT_THAT(std::string(OptimizerStep(sgd, params, grads, *state).message()),
              HasSubstr("sgd needs an SgdState"));
  auto sgd_state = MakeOptimizerState(sgd.kind, params.size());
  ASSERT_TRUE(OptimizerStep(sgd, params, grads, *sgd_state).ok());
  EXPECT_FLOAT_EQ(params[0], 1.0f - 0.1f * 0.5f);
}

}  // namespace
}  // namespace flatshard
