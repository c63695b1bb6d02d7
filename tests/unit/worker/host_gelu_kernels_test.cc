// GELU (tanh) on host memory (worker/device/host/host_gelu_kernels.h): the
// portable copy is element_ops.h's formula one element at a time, bit for
// bit; the AVX2 copy (libmvec's vector expf) stays within a few ulp of it
// wherever the value is not lost to cancellation, and agrees on every special
// value (zeros, infinities, NaN, overflow of e^2u).
#include "worker/device/host/host_gelu_kernels.h"

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"

#include "worker/device/kernels/element_ops.h"

namespace flatshard::host_kernels {
namespace {

// Not a multiple of any vector width: the loops' tails run.
constexpr size_t kCount = 4099;

std::vector<float> Inputs() {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(kCount);
  for (float& v : x) v = normal(rng);
  const float inf = std::numeric_limits<float>::infinity();
  const float specials[] = {0.0f,   -0.0f, 1e-30f, -1e-30f, 1e-45f, 9.0f,          -9.0f,  50.0f,
                            -50.0f, 1e20f, -1e20f, inf,     -inf,   std::nanf(""), 3.4e38f};
  for (size_t i = 0; i < std::size(specials); ++i) x[i * 97] = specials[i];
  return x;
}

bool SameBits(float a, float b) { return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b); }

TEST(HostGeluKernelsTest, PortableCopyIsTheElementFormulaBitForBit) {
  const std::vector<float> x = Inputs();
  std::vector<float> dy(kCount), y(kCount), dx(kCount);
  for (size_t i = 0; i < kCount; ++i) dy[i] = 0.5f + static_cast<float>(i % 13) * 0.25f;
  GeluTanhForward(x.data(), y.data(), kCount, HostIsa::kPortable);
  GeluTanhBackward(x.data(), dy.data(), dx.data(), kCount, HostIsa::kPortable);
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_TRUE(SameBits(y[i], kernels::GeluTanh(x[i]))) << "x = " << x[i];
    ASSERT_TRUE(SameBits(dx[i], dy[i] * kernels::GeluTanhGrad(x[i]))) << "x = " << x[i];
  }
}

TEST(HostGeluKernelsTest, VectorCopyStaysWithinAFewUlpOfThePortableOne) {
  if (!HostIsaSupported(HostIsa::kAvx2Fma)) GTEST_SKIP() << "this CPU has no AVX2 + FMA";
  const std::vector<float> x = Inputs();
  std::vector<float> dy(kCount, 1.0f), y0(kCount), y1(kCount), dx0(kCount), dx1(kCount);
  GeluTanhForward(x.data(), y0.data(), kCount, HostIsa::kPortable);
  GeluTanhForward(x.data(), y1.data(), kCount, HostIsa::kAvx2Fma);
  GeluTanhBackward(x.data(), dy.data(), dx0.data(), kCount, HostIsa::kPortable);
  GeluTanhBackward(x.data(), dy.data(), dx1.data(), kCount, HostIsa::kAvx2Fma);
  size_t identical = 0;
  for (size_t i = 0; i < kCount; ++i) {
    ASSERT_EQ(std::isnan(y0[i]), std::isnan(y1[i])) << "x = " << x[i];
    ASSERT_EQ(std::isnan(dx0[i]), std::isnan(dx1[i])) << "x = " << x[i];
    if (!std::isfinite(y0[i]) || !std::isfinite(y1[i]) || !std::isfinite(dx0[i]) ||
        !std::isfinite(dx1[i])) {  // the same infinity or both NaN
      ASSERT_TRUE(y0[i] == y1[i] || std::isnan(y0[i])) << "x = " << x[i];
      ASSERT_TRUE(dx0[i] == dx1[i] || std::isnan(dx0[i])) << "x = " << x[i];
      continue;
    }
    identical += SameBits(y0[i], y1[i]) && SameBits(dx0[i], dx1[i]);
    // tanh is within ~1e-7 absolute either way; GELU scales it by x / 2 and
    // its gradient by up to x^2 (du): bound the difference accordingly.
    const float scale = std::max(1.0f, std::fabs(x[i]));
    EXPECT_LE(std::fabs(y0[i] - y1[i]), 4e-7f * scale) << "x = " << x[i];
    EXPECT_LE(std::fabs(dx0[i] - dx1[i]), 4e-7f * scale * scale) << "x = " << x[i];
  }
  // The vector expf is the scalar one's bits almost everywhere.
  EXPECT_GT(identical, kCount * 9 / 10);
}

}  // namespace
}  // namespace flatshard::host_kernels
