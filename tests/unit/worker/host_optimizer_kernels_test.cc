// The host optimizer passes (worker/device/host/host_optimizer_kernels.h) in
// every compiled copy this CPU runs against core/optimizer_update.h's element
// functions called one element at a time: the same bits for every flag
// combination, on values that include zeros of both signs, subnormals,
// infinities and NaNs. The vectorized copies must not change a single result
// (torch equality rests on it: tests/unit/core/optimizer_test.cc).
#include "worker/device/host/host_optimizer_kernels.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace flatshard::host_kernels {
namespace {

// 1,037 elements: not a multiple of any vector width, so the loops' tails run.
constexpr size_t kCount = 1037;

std::vector<float> Values(uint32_t seed, bool positive) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(kCount);
  for (float& x : v) x = positive ? std::fabs(normal(rng)) * 1e-3f : normal(rng);
  const float specials[] = {0.0f,
                            -0.0f,
                            std::numeric_limits<float>::denorm_min(),
                            -1e-40f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            3e38f,
                            1e-30f};
  for (size_t i = 0; i < std::size(specials); ++i) {
    const float s = specials[i];
    v[(seed * 7 + i * 113) % kCount] = positive ? std::fabs(s) : s;
  }
  return v;
}

// Bitwise equal, except that any NaN equals any NaN (payloads are not part
// of torch's contract either).
void ExpectSameBits(const std::vector<float>& want, const std::vector<float>& got,
                    const std::string& what) {
  ASSERT_EQ(want.size(), got.size());
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(want[i]) && std::isnan(got[i])) continue;
    uint32_t a = 0, b = 0;
    std::memcpy(&a, &want[i], 4);
    std::memcpy(&b, &got[i], 4);
    ASSERT_EQ(a, b) << what << " element " << i << ": want " << want[i] << ", got " << got[i];
  }
}

std::vector<HostIsa> Isas() {
  std::vector<HostIsa> isas = {HostIsa::kBest, HostIsa::kPortable};
  if (HostIsaSupported(HostIsa::kAvx2Fma)) isas.push_back(HostIsa::kAvx2Fma);
  return isas;
}

TEST(HostOptimizerKernelsTest, AdamMatchesTheElementFormulaInEveryCopyAndFlagCombination) {
  int cases = 0;
  for (int flags = 0; flags < 32; ++flags) {
    AdamCoefficients c;
    c.maximize = (flags & 1) != 0;
    c.decoupled = (flags & 2) != 0;
    c.l2 = (flags & 4) != 0;
    c.amsgrad = (flags & 8) != 0;
    // Both of torch.lerp's formulas: weight below and above 0.5.
    c.lerp_weight = (flags & 16) != 0 ? 0.9f : 0.1f;
    c.decay_factor = 0.99f;
    c.weight_decay = 0.01f;
    c.beta2 = 0.999f;
    c.one_minus_beta2 = 0.001f;
    c.bias_correction2_sqrt = 0.0316f;
    c.eps = 1e-8f;
    c.neg_step_size = -0.01f;
    const auto seed = static_cast<uint32_t>(flags);
    const std::vector<float> p0 = Values(seed, false), g = Values(seed + 100, false),
                             m0 = Values(seed + 200, false), v0 = Values(seed + 300, true),
                             vmax0 = Values(seed + 400, true);
    std::vector<float> p = p0, m = m0, v = v0, vmax = vmax0;
    for (size_t i = 0; i < kCount; ++i) AdamUpdate(c, p[i], g[i], m[i], v[i], vmax[i]);
    for (HostIsa isa : Isas()) {
      std::vector<float> pi = p0, mi = m0, vi = v0, vmaxi = vmax0;
      AdamStep(c, pi.data(), g.data(), mi.data(), vi.data(), c.amsgrad ? vmaxi.data() : nullptr,
               kCount, isa);
      const std::string what =
          "adam flags " + std::to_string(flags) + " isa " + std::to_string(static_cast<int>(isa));
      ExpectSameBits(p, pi, what + " param");
      ExpectSameBits(m, mi, what + " exp_avg");
      ExpectSameBits(v, vi, what + " exp_avg_sq");
      if (c.amsgrad) ExpectSameBits(vmax, vmaxi, what + " max_exp_avg_sq");
      ++cases;
    }
  }
  EXPECT_GE(cases, 64);
}

TEST(HostOptimizerKernelsTest, SgdMatchesTheElementFormulaInEveryCopyAndFlagCombination) {
  for (int flags = 0; flags < 32; ++flags) {
    SgdCoefficients c;
    c.maximize = (flags & 1) != 0;
    c.weight_decay = (flags & 2) != 0;
    c.momentum = (flags & 4) != 0;
    c.first_momentum_step = (flags & 8) != 0;
    c.nesterov = (flags & 16) != 0;
    c.weight_decay_value = 0.01f;
    c.momentum_value = 0.9f;
    c.one_minus_dampening = 0.8f;
    c.neg_lr = -0.05f;
    const auto seed = static_cast<uint32_t>(flags + 1000);
    const std::vector<float> p0 = Values(seed, false), g = Values(seed + 1, false),
                             b0 = Values(seed + 2, false);
    std::vector<float> p = p0, b = b0;
    for (size_t i = 0; i < kCount; ++i) SgdUpdate(c, p[i], g[i], b[i]);
    for (HostIsa isa : Isas()) {
      std::vector<float> pi = p0, bi = b0;
      SgdStep(c, pi.data(), g.data(), c.momentum ? bi.data() : nullptr, kCount, isa);
      const std::string what =
          "sgd flags " + std::to_string(flags) + " isa " + std::to_string(static_cast<int>(isa));
      ExpectSameBits(p, pi, what + " param");
      if (c.momentum) ExpectSameBits(b, bi, what + " momentum");
    }
  }
}

TEST(HostOptimizerKernelsTest, EmptyAndSingleElementShards) {
  AdamCoefficients c;
  c.lerp_weight = 0.1f;
  c.beta2 = 0.999f;
  c.one_minus_beta2 = 0.001f;
  c.eps = 1e-8f;
  c.neg_step_size = -0.01f;
  float p = 1.0f, g = 0.5f, m = 0.0f, v = 0.0f;
  AdamStep(c, &p, &g, &m, &v, nullptr, 0);
  EXPECT_EQ(p, 1.0f);  // nothing touched
  AdamStep(c, &p, &g, &m, &v, nullptr, 1);
  EXPECT_NE(p, 1.0f);
  EXPECT_EQ(m, 0.05f);
}

}  // namespace
}  // namespace flatshard::host_kernels
