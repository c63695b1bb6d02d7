// The shared element bodies of the device kernels (worker/device/kernels/element_ops.h).
#include "worker/device/kernels/element_ops.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include <gtest/gtest.h>

namespace flatshard::kernels {
namespace {

// Inputs that stress rounding: random bit patterns (every exponent, subnormals,
// infinities, NaNs) and the edges by name.
std::vector<float> Inputs() {
  std::vector<float> v = {0.0f,
                          -0.0f,
                          1.0f,
                          3.0f,
                          std::numeric_limits<float>::min(),
                          std::numeric_limits<float>::denorm_min(),
                          std::numeric_limits<float>::max(),
                          -std::numeric_limits<float>::max(),
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity()};
  std::mt19937 rng(7);
  for (int i = 0; i < 200000; ++i) v.push_back(std::bit_cast<float>(static_cast<uint32_t>(rng())));
  return v;
}

bool SameBits(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
}

TEST(DivisorTest, EqualsTheQuotientBitForBitForEveryFactor) {
  const std::vector<float> inputs = Inputs();
  for (const double factor : {1.0, 2.0, 4.0, 8.0, 1024.0, 3.0, 6.0, 12.0, 0.5}) {
    const Divisor d = Divisor::Of(factor);
    const auto f = static_cast<float>(factor);
    int mismatches = 0;
    for (const float x : inputs) {
      if (!SameBits(d(x), x / f) && ++mismatches <= 3) {
        ADD_FAILURE() << "factor " << factor << ": " << x << " / " << f << " = " << x / f
                      << ", the divisor gives " << d(x);
      }
    }
    EXPECT_EQ(mismatches, 0) << "factor " << factor;
  }
}

TEST(DivisorTest, MultipliesOnlyByExactInverses) {
  EXPECT_EQ(Divisor::Of(1).inverse, 1.0f);
  EXPECT_EQ(Divisor::Of(8).inverse, 0.125f);
  EXPECT_EQ(Divisor::Of(3).inverse, 0.0f) << "1/3 is not exact: divide";
  EXPECT_EQ(Divisor::Of(6).inverse, 0.0f);
}

TEST(PrepareGradTest, PadsWithZerosPastTheGradientAndRoundsBeforeDividing) {
  const std::vector<float> grad = {1.0f, 3.0f, 1.0f / 3.0f};
  std::vector<uint16_t> out(5, 0xFFFF);
  for (size_t i = 0; i < out.size(); ++i) {
    PrepareGradElement<DType::kBFloat16>(grad.data(), grad.size(), out.data(), Divisor::Of(3), i);
  }
  using E = Element<DType::kBFloat16>;
  // Rounded to bf16 first, then divided in float32 and rounded again (torch's
  // div_ on a bf16 tensor).
  EXPECT_EQ(out[0], E::FromFloat(1.0f / 3.0f));
  EXPECT_EQ(out[1], E::FromFloat(1.0f));
  EXPECT_EQ(out[2], E::FromFloat(E::ToFloat(E::FromFloat(1.0f / 3.0f)) / 3.0f));
  EXPECT_EQ(out[3], E::FromFloat(0.0f));
  EXPECT_EQ(out[4], E::FromFloat(0.0f));
}

}  // namespace
}  // namespace flatshard::kernels
