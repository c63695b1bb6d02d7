// Tests core/optimizer.h: torch.optim's single-tensor SGD, Adam and AdamW
// (`_single_tensor_sgd`, `_single_tensor_adam`, `_single_tensor_adamw`) on a
// flat float32 shard, against
// - the update formulas evaluated independently in double precision below
//   (float32 results must stay within ~1e-6 relative per step), and
// - golden values printed by torch 2.15.0 on CPU (torch.optim.SGD / AdamW with
//   foreach=False), which SGD and Adam's state tensors match bit for bit.
// Plus torch's option checks, the state names a checkpoint saves, and lazy init.
#include "core/optimizer.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr size_t kShard = 1037;  // odd, so no vector-width assumption hides
constexpr int kSteps = 8;
constexpr double kRelPerStep = 1e-6;

std::vector<float> RandomVector(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::vector<double> ToDouble(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// |actual - expected| <= kRelPerStep * steps * (|expected| + floor): relative
// error with a floor at the data's scale (values near 0 come from cancellation
// of terms of that scale).
void ExpectClose(std::span<const float> actual, const std::vector<double>& expected, int steps,
                 double floor, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    const double tol = kRelPerStep * steps * (std::fabs(expected[i]) + floor);
    ASSERT_NEAR(static_cast<double>(actual[i]), expected[i], tol)
        << what << "[" << i << "] after step " << steps;
  }
}

// ---- Independent double-precision references (the textbook formulas). ----

struct SgdReference {
  std::vector<double> param;
  std::vector<double> buf = {};
  bool has_buf = false;

  void Step(const std::vector<float>& grad_in, const SgdOptions& o) {
    if (!has_buf) buf.assign(param.size(), 0.0);
    for (size_t i = 0; i < param.size(); ++i) {
      double g = o.maximize ? -static_cast<double>(grad_in[i]) : grad_in[i];
      g += o.weight_decay * param[i];
      if (o.momentum != 0.0) {
        buf[i] = has_buf ? o.momentum * buf[i] + (1.0 - o.dampening) * g : g;
        g = o.nesterov ? g + o.momentum * buf[i] : buf[i];
      }
      param[i] -= o.lr * g;
    }
    if (o.momentum != 0.0) has_buf = true;
  }
};

struct AdamReference {
  std::vector<double> param;
  std::vector<double> m = {}, v = {}, vmax = {};
  int t = 0;

  void Step(const std::vector<float>& grad_in, const AdamOptions& o) {
    if (t == 0) {
      m.assign(param.size(), 0.0);
      v.assign(param.size(), 0.0);
      vmax.assign(param.size(), 0.0);
    }
    ++t;
    const double bc1 = 1.0 - std::pow(o.beta1, t);
    const double bc2 = 1.0 - std::pow(o.beta2, t);
    for (size_t i = 0; i < param.size(); ++i) {
      double g = o.maximize ? -static_cast<double>(grad_in[i]) : grad_in[i];
      if (o.decoupled_weight_decay) {
        param[i] *= 1.0 - o.lr * o.weight_decay;
      } else {
        g += o.weight_decay * param[i];
      }
      m[i] = o.beta1 * m[i] + (1.0 - o.beta1) * g;
      v[i] = o.beta2 * v[i] + (1.0 - o.beta2) * g * g;
      vmax[i] = std::max(vmax[i], v[i]);
      const double second = o.amsgrad ? vmax[i] : v[i];
      const double m_hat = m[i] / bc1;
      const double v_hat_sqrt = std::sqrt(second) / std::sqrt(bc2);
      param[i] -= o.lr * m_hat / (v_hat_sqrt + o.eps);
    }
  }
};

// ---- Validation (torch's constructor checks). ----

TEST(OptimizerOptionsTest, SgdChecksNameTheField) {
  EXPECT_TRUE(ValidateSgdOptions({.lr = 0.1}).ok());
  EXPECT_EQ(std::string(ValidateSgdOptions({.lr = -0.1}).message()),
            "optimizer.lr must be >= 0, got -0.1");
  EXPECT_THAT(std::string(ValidateSgdOptions({.lr = NAN}).message()),
              HasSubstr("optimizer.lr must be >= 0"));
  EXPECT_THAT(std::string(ValidateSgdOptions({.lr = 0.1, .momentum = -1}).message()),
              HasSubstr("optimizer.momentum must be >= 0, got -1"));
  EXPECT_THAT(std::string(ValidateSgdOptions({.lr = 0.1, .weight_decay = -1e-4}).message()),
              HasSubstr("optimizer.weight_decay must be >= 0, got -0.0001"));
  EXPECT_THAT(std::string(ValidateSgdOptions({.lr = 0.1, .nesterov = true}).message()),
              HasSubstr("Nesterov momentum requires a momentum and zero dampening"));
  EXPECT_THAT(std::string(ValidateSgdOptions(
                              {.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true})
                              .message()),
              HasSubstr("optimizer.nesterov"));
  EXPECT_TRUE(ValidateSgdOptions({.lr = 0.1, .momentum = 0.9, .nesterov = true}).ok());
  EXPECT_EQ(ValidateSgdOptions({.lr = -1}).code(), absl::StatusCode::kInvalidArgument);
}

TEST(OptimizerOptionsTest, AdamChecksNameTheField) {
  EXPECT_TRUE(ValidateAdamOptions({}).ok());
  EXPECT_EQ(std::string(ValidateAdamOptions({.lr = -0.1}).message()),
            "optimizer.lr must be >= 0, got -0.1");
  EXPECT_THAT(std::string(ValidateAdamOptions({.eps = -1e-8}).message()),
              HasSubstr("optimizer.eps must be >= 0"));
  EXPECT_EQ(std::string(ValidateAdamOptions({.beta1 = 1.0}).message()),
            "optimizer.beta1 must be in [0, 1), got 1");
  EXPECT_THAT(std::string(ValidateAdamOptions({.beta2 = -0.5}).message()),
              HasSubstr("optimizer.beta2 must be in [0, 1), got -0.5"));
  EXPECT_THAT(std::string(ValidateAdamOptions({.beta2 = NAN}).message()),
              HasSubstr("optimizer.beta2"));
  EXPECT_THAT(std::string(ValidateAdamOptions({.weight_decay = -1}).message()),
              HasSubstr("optimizer.weight_decay must be >= 0"));
  EXPECT_TRUE(ValidateAdamOptions({.beta1 = 0.0, .beta2 = 0.0, .eps = 0.0}).ok());
}

TEST(OptimizerStepTest, RejectsMismatchedSizesAndBadOptionsWithoutTouchingAnything) {
  std::vector<float> params(4, 1.0f), grads(3, 1.0f);
  SgdState sgd(4);
  EXPECT_THAT(std::string(SgdStep(params, grads, sgd, {.lr = 0.1}).message()),
              HasSubstr("grads has 3 elements but params has 4"));
  SgdState wrong(5);
  grads.assign(4, 1.0f);
  EXPECT_THAT(std::string(SgdStep(params, grads, wrong, {.lr = 0.1}).message()),
              HasSubstr("state is for a shard of 5 elements but params has 4"));
  EXPECT_FALSE(SgdStep(params, grads, sgd, {.lr = -1}).ok());
  AdamState adam(4);
  EXPECT_FALSE(AdamStep(params, grads, adam, {.beta1 = 1.5}).ok());
  EXPECT_THAT(params, ::testing::Each(1.0f));
  EXPECT_EQ(sgd.step(), 0.0);
  EXPECT_THAT(adam.StateNames(), IsEmpty());
}

// ---- State naming, lazy init and checkpoint access. ----

TEST(OptimizerStateTest, SgdMomentumBufferAppearsOnTheFirstMomentumStep) {
  std::vector<float> params = {1.0f, 2.0f}, grads = {0.5f, -0.25f};
  SgdState state(2);
  EXPECT_THAT(state.StateNames(), IsEmpty());
  ASSERT_TRUE(SgdStep(params, grads, state, {.lr = 0.1}).ok());
  EXPECT_THAT(state.StateNames(), IsEmpty());  // momentum == 0 keeps none
  ASSERT_TRUE(SgdStep(params, grads, state, {.lr = 0.1, .momentum = 0.9, .dampening = 0.5}).ok());
  EXPECT_THAT(state.StateNames(), ElementsAre("momentum_buffer"));
  // torch clones the grad on the first momentum step: no dampening applied.
  EXPECT_THAT(*state.State("momentum_buffer"), ElementsAre(0.5f, -0.25f));
  EXPECT_EQ(state.step(), 2.0);
}

TEST(OptimizerStateTest, AdamCreatesTorchNamedStateLazily) {
  std::vector<float> params = {1.0f, 2.0f, 3.0f}, grads = {0.1f, 0.2f, 0.3f};
  AdamState plain(3), ams(3);
  EXPECT_THAT(plain.StateNames(), IsEmpty());
  ASSERT_TRUE(AdamStep(params, grads, plain, {}).ok());
  EXPECT_THAT(plain.StateNames(), ElementsAre("exp_avg", "exp_avg_sq"));
  ASSERT_TRUE(AdamStep(params, grads, ams, {.amsgrad = true}).ok());
  EXPECT_THAT(ams.StateNames(), ElementsAre("exp_avg", "exp_avg_sq", "max_exp_avg_sq"));
  EXPECT_EQ(plain.step(), 1.0);

  // torch would raise KeyError('max_exp_avg_sq'): amsgrad turned on later.
  const absl::Status status = AdamStep(params, grads, plain, {.amsgrad = true});
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(status.message()), HasSubstr("max_exp_avg_sq"));
}

TEST(OptimizerStateTest, TensorsMoveInWithTheSameChecksAsCopies) {
  AdamState state(3);
  std::vector<float> values = {1.0f, 2.0f, 3.0f};
  const float* storage = values.data();
  ASSERT_TRUE(state.SetState("exp_avg", std::move(values)).ok());
  absl::StatusOr<std::span<const float>> held = std::as_const(state).State("exp_avg");
  ASSERT_TRUE(held.ok());
  EXPECT_EQ(held->data(), storage);  // taken over, not copied
  EXPECT_EQ(state.SetState("exp_avg", std::vector<float>{1.0f}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(state.SetState("momentum_buffer", std::vector<float>(3)).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(OptimizerStateTest, NamedAccessReportsWhatIsMissingOrWrong) {
  AdamState state(3);
  EXPECT_EQ(state.State("exp_avg").status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(state.State("momentum_buffer").status().message()),
              HasSubstr("it keeps only exp_avg, exp_avg_sq, max_exp_avg_sq"));
  const std::vector<float> two = {1.0f, 2.0f};
  EXPECT_THAT(std::string(state.SetState("exp_avg", two).message()),
              HasSubstr("'exp_avg' has 2 elements but the shard has 3"));
  const std::vector<float> three = {1.0f, 2.0f, 3.0f};
  EXPECT_THAT(std::string(state.SetState("momentum", three).message()),
              HasSubstr("no tensor named 'momentum'"));
  ASSERT_TRUE(state.SetState("exp_avg", three).ok());
  EXPECT_THAT(state.StateNames(), ElementsAre("exp_avg"));
  // Partly loaded state cannot step: exp_avg_sq is missing.
  std::vector<float> params(3, 0.0f);
  EXPECT_EQ(AdamStep(params, three, state, {}).code(), absl::StatusCode::kFailedPrecondition);
  (*state.State("exp_avg"))[1] = 7.0f;  // spans write through
  EXPECT_THAT(*std::as_const(state).State("exp_avg"), ElementsAre(1.0f, 7.0f, 3.0f));
}

// torch keeps `step` in a float32 tensor: past 2^24 it stops counting.
TEST(OptimizerStateTest, StepIsAFloat32Counter) {
  AdamState state(1);
  state.set_step(16777216.0);
  std::vector<float> params = {1.0f}, grads = {1.0f};
  ASSERT_TRUE(AdamStep(params, grads, state, {}).ok());
  EXPECT_EQ(state.step(), 16777216.0);
  state.set_step(0.1);
  EXPECT_EQ(state.step(), static_cast<double>(0.1f));
}

// A checkpoint saves step() and each StateNames() tensor; a fresh state loaded
// from them continues exactly as the original would have.
TEST(OptimizerStateTest, SavedAndLoadedStateContinuesBitForBit) {
  const AdamOptions options{.lr = 1e-2, .amsgrad = true, .decoupled_weight_decay = true};
  std::vector<float> straight = RandomVector(kShard, 1), resumed = straight;
  AdamState original(kShard);
  for (int t = 0; t < 3; ++t) {
    const std::vector<float> g = RandomVector(kShard, 100 + static_cast<uint32_t>(t));
    ASSERT_TRUE(AdamStep(straight, g, original, options).ok());
  }
  resumed = straight;
  AdamState loaded(kShard);
  for (const std::string& name : original.StateNames()) {
    ASSERT_TRUE(loaded.SetState(name, *std::as_const(original).State(name)).ok()) << name;
  }
  loaded.set_step(original.step());
  for (int t = 3; t < 6; ++t) {
    const std::vector<float> g = RandomVector(kShard, 100 + static_cast<uint32_t>(t));
    ASSERT_TRUE(AdamStep(straight, g, original, options).ok());
    ASSERT_TRUE(AdamStep(resumed, g, loaded, options).ok());
  }
  EXPECT_EQ(straight, resumed);
  EXPECT_EQ(loaded.step(), 6.0);
}

// ---- Against the double-precision formulas, several steps of random data. ----

struct SgdCase {
  const char* name;
  SgdOptions options;
};

class SgdReferenceTest : public ::testing::TestWithParam<SgdCase> {};

TEST_P(SgdReferenceTest, TracksTheFormulaEveryStep) {
  const SgdOptions& options = GetParam().options;
  std::vector<float> params = RandomVector(kShard, 7);
  SgdReference ref{.param = ToDouble(params)};
  SgdState state(kShard);
  for (int t = 1; t <= kSteps; ++t) {
    const std::vector<float> grads = RandomVector(kShard, 1000 + static_cast<uint32_t>(t));
    ASSERT_TRUE(SgdStep(params, grads, state, options).ok());
    ref.Step(grads, options);
    ExpectClose(params, ref.param, t, 1.0, "param");
    if (options.momentum != 0.0) {
      ExpectClose(*state.State("momentum_buffer"), ref.buf, t, 1.0, "buf");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    TorchSgd, SgdReferenceTest,
    ::testing::Values(SgdCase{"Plain", {.lr = 0.1}},
                      SgdCase{"Momentum", {.lr = 0.05, .momentum = 0.9}},
                      SgdCase{"Dampening", {.lr = 0.05, .momentum = 0.9, .dampening = 0.3}},
                      SgdCase{"Nesterov", {.lr = 0.05, .momentum = 0.9, .nesterov = true}},
                      SgdCase{"WeightDecay", {.lr = 0.1, .weight_decay = 0.05}},
                      SgdCase{"MomentumWeightDecay",
                              {.lr = 0.05, .momentum = 0.5, .weight_decay = 0.01}},
                      SgdCase{"Maximize", {.lr = 0.1, .momentum = 0.9, .maximize = true}},
                      SgdCase{"NesterovWeightDecayMaximize",
                              {.lr = 0.02,
                               .momentum = 0.8,
                               .nesterov = true,
                               .weight_decay = 0.1,
                               .maximize = true}}),
    [](const ::testing::TestParamInfo<SgdCase>& param_info) {
      return std::string(param_info.param.name);
    });

struct AdamCase {
  const char* name;
  AdamOptions options;
};

class AdamReferenceTest : public ::testing::TestWithParam<AdamCase> {};

TEST_P(AdamReferenceTest, TracksTheFormulaEveryStep) {
  const AdamOptions& options = GetParam().options;
  std::vector<float> params = RandomVector(kShard, 9);
  AdamReference ref{.param = ToDouble(params)};
  AdamState state(kShard);
  for (int t = 1; t <= kSteps; ++t) {
    const std::vector<float> grads = RandomVector(kShard, 2000 + static_cast<uint32_t>(t));
    ASSERT_TRUE(AdamStep(params, grads, state, options).ok());
    ref.Step(grads, options);
    EXPECT_EQ(state.step(), t);
    ExpectClose(params, ref.param, t, 1.0, "param");
    ExpectClose(*state.State("exp_avg"), ref.m, t, 1.0, "exp_avg");
    ExpectClose(*state.State("exp_avg_sq"), ref.v, t, 1e-3, "exp_avg_sq");
    if (options.amsgrad) ExpectClose(*state.State("max_exp_avg_sq"), ref.vmax, t, 1e-3, "max");
  }
}

INSTANTIATE_TEST_SUITE_P(
    TorchAdam, AdamReferenceTest,
    ::testing::Values(
        AdamCase{"Plain", {}}, AdamCase{"LargeLr", {.lr = 0.1}},
        // 1 - beta1 >= 0.5 takes torch lerp's other branch.
        AdamCase{"SmallBeta1", {.lr = 1e-2, .beta1 = 0.3, .beta2 = 0.9}},
        AdamCase{"WeightDecay", {.lr = 1e-2, .weight_decay = 0.1}},
        AdamCase{"Amsgrad", {.lr = 1e-2, .amsgrad = true}},
        AdamCase{"Maximize", {.lr = 1e-2, .maximize = true}},
        AdamCase{
            "AmsgradWeightDecayMaximize",
            {.lr = 1e-2, .eps = 1e-3, .weight_decay = 0.05, .amsgrad = true, .maximize = true}},
        AdamCase{"AdamW", {.lr = 1e-2, .weight_decay = 1e-2, .decoupled_weight_decay = true}},
        AdamCase{
            "AdamWAmsgrad",
            {.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true, .decoupled_weight_decay = true}}),
    [](const ::testing::TestParamInfo<AdamCase>& param_info) {
      return std::string(param_info.param.name);
    });

// ---- Golden values from torch 2.15.0 CPU (foreach=False), 19 elements, 3 steps. ----

const std::vector<float> kGoldenP0 = {-0.51079756f,  1.02827179f,  -0.35315159f, -1.59253228f,
                                      -0.154625118f, -1.09643877f, 1.36659765f,  0.68928194f,
                                      0.0744391829f, -0.18429555f, 0.79603678f,  0.602252185f,
                                      2.01754236f,   -1.16862941f, -1.32419419f, 1.12674356f,
                                      1.9112736f,    0.297904074f, -0.704122961f};
const std::vector<std::vector<float>> kGoldenGrads = {
    {0.00138337852f, 4.9617486f, -0.00605279487f, 9.9747839f, -0.0215572063f, 0.000927063578f,
     0.00390965072f, 1.29834521f, -0.00445990451f, -1.58894718f, -1.9287914f, 0.0569985285f,
     0.148411646f, -0.757194936f, -1.15979707f, 13.550045f, -0.108166672f, 10.0475388f,
     -0.248327896f},
    {0.00170404941f, 0.00392007781f, 0.0540494435f, 0.0319221504f, 0.0950930342f, -0.00457144808f,
     -1.06930089f, 0.0764191672f, -0.840285361f, 0.0034638131f, -2.85904169f, -0.132180601f,
     -0.615214407f, 0.000558988366f, 0.110343695f, 0.00388998748f, -2.26788282f, -0.695019305f,
     8.54308605f},
    {1.1884011f, 0.00330958003f, -0.00574968662f, -0.145413294f, -0.013702645f, 1.23588872f,
     -0.119371273f, -0.00297809811f, -0.016966654f, 0.00466722017f, 0.0549746454f, 10.7622223f,
     -4.68973017f, 1.04905665f, -0.358882993f, 0.625100434f, -8.2303896f, -1.2445153f,
     1.67893422f}};

void RunSgdGolden(const SgdOptions& options, const std::vector<float>& want_param,
                  const std::vector<float>& want_buf) {
  std::vector<float> params = kGoldenP0;
  SgdState state(params.size());
  for (const std::vector<float>& g : kGoldenGrads) {
    ASSERT_TRUE(SgdStep(params, g, state, options).ok());
  }
  EXPECT_EQ(params, want_param);
  const std::span<const float> buf = *std::as_const(state).State("momentum_buffer");
  EXPECT_EQ(std::vector<float>(buf.begin(), buf.end()), want_buf);
}

// torch.optim.SGD(lr=0.05, momentum=0.9, dampening=0.25, weight_decay=0.01).
TEST(TorchGoldenTest, SgdMomentumDampeningWeightDecayIsBitExact) {
  RunSgdGolden({.lr = 0.05, .momentum = 0.9, .dampening = 0.25, .weight_decay = 0.01},
               {-0.554424226f, 0.353394359f, -0.355104238f, -2.93633747f, -0.157588303f,
                -1.13990736f, 1.44338048f, 0.506433547f, 0.135356188f, 0.0309218038f, 1.25691199f,
                0.198895082f, 2.21220732f, -1.10260952f, -1.15829349f, -0.734791756f, 2.39145017f,
                -0.967369318f, -1.34030783f},
               {0.882160187f, 4.04190207f, 0.0193712618f, 7.94600916f, 0.0329915471f, 0.900091231f,
                -0.777317762f, 1.11502063f, -0.581626356f, -1.28365803f, -3.43033338f, 8.04204369f,
                -3.76727152f, 0.148533404f, -1.1625073f, 11.4579287f, -7.74778509f, 6.73228312f,
                6.80676842f});
}

// torch.optim.SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01, maximize=True).
TEST(TorchGoldenTest, SgdNesterovMaximizeIsBitExact) {
  RunSgdGolden(
      {.lr = 0.05, .momentum = 0.9, .nesterov = true, .weight_decay = 0.01, .maximize = true},
      {-0.395377278f, 1.87687802f, -0.345998198f, 0.116976507f, -0.146129802f, -0.975080252f,
       1.20563972f, 0.919491649f, -0.0420205295f, -0.455452621f, 0.0797570795f, 1.6141293f,
       1.50608063f, -1.19419897f, -1.53715038f, 3.50856709f, 0.796036422f, 1.80945325f,
       0.572388172f},
      {-1.20487714f, -3.98705578f, -0.047513321f, -7.9839325f, -0.0585624799f, -1.26220644f,
       1.11455977f, -1.09586012f, 0.778042793f, 1.27076709f, 4.09505415f, -10.6731262f, 5.17756462f,
       -0.469536901f, 1.16070819f, -11.5437021f, 10.4084406f, -6.23887348f, -9.17805767f});
}

// torch.optim.AdamW(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1, amsgrad=True).
// The state tensors match bit for bit. The params may not: torch's CPU sqrt
// is not correctly rounded and ours is, so denominators can differ by an
// ulp; they agree to float32 rounding of the update.
TEST(TorchGoldenTest, AdamWAmsgradStateIsBitExact) {
  const AdamOptions options{.lr = 0.01,
                            .beta1 = 0.8,
                            .beta2 = 0.99,
                            .weight_decay = 0.1,
                            .amsgrad = true,
                            .decoupled_weight_decay = true};
  std::vector<float> params = kGoldenP0;
  AdamState state(params.size());
  for (const std::vector<float>& g : kGoldenGrads) {
    ASSERT_TRUE(AdamStep(params, g, state, options).ok());
  }
  auto tensor = [&](absl::string_view name) {
    const std::span<const float> s = *std::as_const(state).State(name);
    return std::vector<float>(s.begin(), s.end());
  };
  EXPECT_EQ(
      tensor("exp_avg"),
      (std::vector<float>{0.238129944f, 0.636392951f, 0.00672321627f, 1.25279725f, 0.00971503463f,
                          0.246564969f, -0.194461957f, 0.177819625f, -0.138409853f, -0.201897591f,
                          -0.693337023f, 2.13859153f, -1.01738369f, 0.112979814f, -0.202575639f,
                          1.86004829f, -2.02278447f, 0.925978899f, 1.67089462f}));
  EXPECT_EQ(tensor("exp_avg_sq"),
            (std::vector<float>{0.0141230188f, 0.241290569f, 2.96109483e-05f, 0.975384951f,
                                9.59548634e-05f, 0.0152744241f, 0.0114623485f, 0.0165794529f,
                                0.0069932607f, 0.0247454401f, 0.117416039f, 1.15845907f,
                                0.22389859f, 0.0166245475f, 0.0145921214f, 1.80340767f,
                                0.728426397f, 1.00971103f, 0.751337349f}));
  EXPECT_EQ(tensor("max_exp_avg_sq"),
            (std::vector<float>{0.0141230188f, 0.24618949f, 2.96109483e-05f, 0.994963109f,
                                9.59548634e-05f, 0.0152744241f, 0.0114623485f, 0.0168570019f,
                                0.0070609916f, 0.025247531f, 0.118571535f, 1.15845907f, 0.22389859f,
                                0.0166245475f, 0.0145921214f, 1.83603716f, 0.728426397f,
                                1.00971103f, 0.751337349f}));
  const std::vector<float> want = {-0.536369026f, 1.00441086f,   -0.353560507f, -1.60846353f,
                                   -0.153936476f, -1.1037488f,   1.36674273f,   0.665675282f,
                                   0.097875461f,  -0.163029566f, 0.820750833f,  0.588163137f,
                                   2.01525283f,   -1.1519841f,   -1.29880476f,  1.10227323f,
                                   1.93201423f,   0.278055042f,  -0.706484377f};
  for (size_t i = 0; i < want.size(); ++i) {
    // An ulp or two of the param, or 1e-6 of the update's size.
    const double tol = 2.5e-7 * std::fabs(want[i]) + 1e-6 * options.lr;
    EXPECT_NEAR(params[i], want[i], tol) << i;
  }
  EXPECT_EQ(state.step(), 3.0);
}

}  // namespace
}  // namespace flatshard
