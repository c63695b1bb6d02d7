// Tests worker/compute/rng.h: the portable log and cosine agree with libm to a
// few ulp, the draws have the right moments, streams are independent of each
// other, and a few pinned values catch any change to the bit stream (which
// would silently change every data set and initialisation).
#include "worker/compute/rng.h"

#include <cmath>
#include <numbers>

#include <gtest/gtest.h>

namespace flatshard::compute {
namespace {

TEST(RngTest, PortableLogMatchesLibm) {
  const CounterRng rng(1);
  for (uint64_t n = 0; n < 20000; ++n) {
    const double x = n < 10000 ? rng.Uniform(n) + 0x1.0p-60 : std::ldexp(rng.Uniform(n) + 0.5, -40);
    EXPECT_NEAR(PortableLog(x), std::log(x), 1e-15 * std::abs(std::log(x)) + 1e-18) << x;
  }
  EXPECT_EQ(PortableLog(1.0), 0.0);
  EXPECT_NEAR(PortableLog(0x1.0p-53), -53 * std::numbers::ln2, 1e-13);
}

TEST(RngTest, PortableCosMatchesLibm) {
  const CounterRng rng(2);
  for (uint64_t n = 0; n < 20000; ++n) {
    const double v = rng.Uniform(n);
    EXPECT_NEAR(PortableCos2Pi(v), std::cos(2 * std::numbers::pi * v), 2e-15) << v;
  }
  EXPECT_EQ(PortableCos2Pi(0.0), 1.0);
  EXPECT_EQ(PortableCos2Pi(0.5), -1.0);
  EXPECT_NEAR(PortableCos2Pi(0.25), 0.0, 1e-17);
}

TEST(RngTest, DrawsHaveTheRightMoments) {
  const CounterRng rng = CounterRng(7).Fork("moments");
  constexpr int kN = 200000;
  double sum = 0, sum2 = 0, usum = 0, usum2 = 0;
  for (uint64_t n = 0; n < kN; ++n) {
    const double z = rng.Normal(n);
    sum += z;
    sum2 += z * z;
    const double u = rng.Uniform(n);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    usum += u;
    usum2 += u * u;
  }
  EXPECT_NEAR(sum / kN, 0.0, 0.01);
  EXPECT_NEAR(sum2 / kN, 1.0, 0.01);
  EXPECT_NEAR(usum / kN, 0.5, 0.005);
  EXPECT_NEAR(usum2 / kN, 1.0 / 3.0, 0.005);
}

TEST(RngTest, StreamsAreKeyedAndIndependentOfOrder) {
  const CounterRng a = CounterRng(1).Fork("x");
  EXPECT_EQ(a.Bits(5), CounterRng(1).Fork("x").Bits(5));  // pure function of (key, n)
  EXPECT_NE(a.Bits(5), CounterRng(2).Fork("x").Bits(5));
  EXPECT_NE(a.Bits(5), CounterRng(1).Fork("y").Bits(5));
  EXPECT_NE(a.Bits(5), a.Bits(6));
  EXPECT_NE(CounterRng(1).Fork(uint64_t{0}).key(), CounterRng(1).key());
  for (uint64_t n = 0; n < 1000; ++n) EXPECT_LT(a.Below(n, 7), 7u);
}

// Pinned: these must never change (they define every synthetic data set and
// every initial weight). Computed once; equal on every IEEE-754 platform.
TEST(RngTest, PinnedValues) {
  EXPECT_EQ(SplitMix64(0), 0xE220A8397B1DCDAFull);  // SplitMix64's published first output
  const CounterRng rng(42);
  EXPECT_EQ(rng.Bits(0), 0x4D9B3F1EC9CF6B1Bull);
  EXPECT_EQ(rng.Normal(3), -0x1.ac1aa76d31c4fp+0);
}

}  // namespace
}  // namespace flatshard::compute
