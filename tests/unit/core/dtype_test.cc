// Tests core/dtype.h: round-to-nearest-even float32 -> bfloat16/float16 checked
// against independent references (a double-precision nearest-value search over
// the representable 16-bit values), exhaustive 16-bit -> float32 -> 16-bit round
// trips, the float16 decoding formula, and the special values.
#include "core/dtype.h"

#include <bit>
#include <cmath>
#include <limits>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// The bfloat16 nearest to `x` with ties to even, found by comparing the two
// candidates in double (exact for float inputs).
uint16_t ReferenceBFloat16(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const uint16_t down = static_cast<uint16_t>(bits >> 16);
  const uint16_t up = static_cast<uint16_t>(down + 1);
  const double lo = BFloat16ToFloat(down);
  // Past the largest finite value, IEEE rounding compares against 2^128 (the
  // next value if the exponent range went on) and then overflows to infinity.
  const double hi = (up & 0x7FFF) == 0x7F80 ? std::copysign(0x1p128, static_cast<double>(x))
                                            : static_cast<double>(BFloat16ToFloat(up));
  const double dlo = std::fabs(static_cast<double>(x) - lo);
  const double dhi = std::fabs(hi - static_cast<double>(x));
  if ((bits & 0xFFFF) == 0) return down;
  if (dlo < dhi) return down;
  if (dhi < dlo) return up;
  return (down & 1) == 0 ? down : up;
}

// The float16 nearest to `x`, ties to even, by binary search over the positive
// finite half bit patterns (ordered like their values) and a comparison in double.
// Values at or past 65520 (halfway to the next power of two) overflow to infinity.
uint16_t ReferenceHalf(float x) {
  const uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 65520.0) return sign | 0x7C00;
  uint16_t lo = 0, hi = 0x7BFF;  // largest pattern with value <= a
  while (lo < hi) {
    const uint16_t mid = static_cast<uint16_t>((lo + hi + 1) / 2);
    if (static_cast<double>(HalfToFloat(mid)) <= a) {
      lo = mid;
    } else {
      hi = static_cast<uint16_t>(mid - 1);
    }
  }
  const double down = HalfToFloat(lo);
  const double up = lo == 0x7BFF ? 65536.0 : static_cast<double>(HalfToFloat(lo + 1));
  const double d_down = a - down, d_up = up - a;
  uint16_t bits = lo;
  if (d_up < d_down || (d_up == d_down && (lo & 1) != 0)) bits = static_cast<uint16_t>(lo + 1);
  return sign | bits;
}

// IEEE binary16 decoding written from the definition, independent of HalfToFloat.
double DecodeHalf(uint16_t bits) {
  const int exponent = (bits >> 10) & 0x1F;
  const int mantissa = bits & 0x3FF;
  const double sign = (bits & 0x8000) != 0 ? -1.0 : 1.0;
  if (exponent == 0) return sign * std::ldexp(mantissa, -24);
  if (exponent == 31) return mantissa == 0 ? sign * INFINITY : NAN;
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4u);
  EXPECT_EQ(DTypeSize(DType::kBFloat16), 2u);
  EXPECT_EQ(DTypeSize(DType::kFloat64), 8u);
  EXPECT_EQ(DTypeSize(DType::kInt64), 8u);
  EXPECT_TRUE(IsFloating(DType::kFloat16));
  EXPECT_FALSE(IsFloating(DType::kInt32));
  EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("torch.float16"), DType::kFloat16);
  EXPECT_EQ(*ParseDType("Float32"), DType::kFloat32);
  EXPECT_THAT(std::string(ParseDType("float8").status().message()),
              HasSubstr("unknown dtype 'float8'"));
  EXPECT_EQ(SafetensorsDTypeName(DType::kBFloat16), "BF16");
  EXPECT_EQ(*ParseSafetensorsDType("F16"), DType::kFloat16);
  EXPECT_FALSE(ParseSafetensorsDType("bf16").ok());
}

TEST(DTypeTest, BFloat16RoundsToNearestEven) {
  // 1 + 2^-8 is exactly halfway between 1 and 1 + 2^-7: ties to even -> 1.
  EXPECT_EQ(FloatToBFloat16(1.0f + 0x1p-8f), 0x3F80);
  // 1 + 3*2^-8 is halfway between 1+2^-7 (odd) and 1+2^-6 (even) -> up.
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * 0x1p-8f), 0x3F82);
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(FloatToBFloat16(-0.0f), 0x8000);
  // Largest finite floats round up to infinity.
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::max()), 0x7F80);
  // A NaN whose payload lives only in the low bits must stay NaN.
  const float nan_low = std::bit_cast<float>(0x7F800001u);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(nan_low))));

  std::mt19937 rng(1);
  for (int i = 0; i < 2000000; ++i) {
    const float x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(x)) continue;
    ASSERT_EQ(FloatToBFloat16(x), ReferenceBFloat16(x)) << std::hexfloat << x;
  }
}

TEST(DTypeTest, HalfRoundsToNearestEven) {
  std::mt19937 rng(2);
  for (int i = 0; i < 2000000; ++i) {
    // Bias towards the half range so subnormals, overflow and ties are hit.
    uint32_t bits = static_cast<uint32_t>(rng());
    if (i % 2 == 0) bits = (bits & 0x80FFFFFFu) | ((100u + bits % 45u) << 23);
    const float x = std::bit_cast<float>(bits);
    if (std::isnan(x)) continue;
    ASSERT_EQ(FloatToHalf(x), ReferenceHalf(x)) << std::hexfloat << x;
  }
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7C00);  // halfway to 2^16 rounds to infinity
  EXPECT_EQ(FloatToHalf(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalf(0x1p-25f), 0x0000);  // tie to even -> zero
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::quiet_NaN()) & 0x7C00, 0x7C00);
}

TEST(DTypeTest, Every16BitValueRoundTripsThroughFloat32) {
  for (uint32_t h = 0; h <= 0xFFFF; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float half = HalfToFloat(bits);
    if (std::isnan(half)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(half))));
    } else {
      ASSERT_EQ(FloatToHalf(half), bits) << h;
      ASSERT_EQ(static_cast<double>(half), DecodeHalf(bits)) << h;
    }
    const float bf = BFloat16ToFloat(bits);
    if (!std::isnan(bf)) {
      ASSERT_EQ(FloatToBFloat16(bf), bits) << h;
    }
  }
}

TEST(DTypeTest, ConvertAndFillElements) {
  const std::vector<float> src = {1.0f, -2.5f, 3.140625f};
  std::vector<uint16_t> bf(3);
  ConvertElements(DType::kFloat32, reinterpret_cast<const std::byte*>(src.data()), DType::kBFloat16,
                  reinterpret_cast<std::byte*>(bf.data()), 3);
  EXPECT_EQ(bf[0], 0x3F80);
  std::vector<double> back(3);
  ConvertElements(DType::kBFloat16, reinterpret_cast<const std::byte*>(bf.data()), DType::kFloat64,
                  reinterpret_cast<std::byte*>(back.data()), 3);
  EXPECT_EQ(back[1], -2.5);
  EXPECT_EQ(back[2], 3.140625);
  std::vector<uint16_t> halves(4);
  FillElements(DType::kFloat16, 42.0, reinterpret_cast<std::byte*>(halves.data()), 4);
  EXPECT_EQ(HalfToFloat(halves[3]), 42.0f);
  EXPECT_EQ(ReadElement(DType::kFloat16, reinterpret_cast<const std::byte*>(halves.data()), 2),
            42.0);
}

}  // namespace
}  // namespace flatshard
