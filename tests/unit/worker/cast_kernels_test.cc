// Tests worker/device/cuda/cast_kernels.h on a real GPU against core/dtype.h's
// host conversions, bit for bit. Skips (does not pass vacuously) without a device.
#include "worker/device/cuda/cast_kernels.h"

#include <bit>
#include <cmath>
#include <random>
#include <vector>

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include "worker/device/cuda/cuda_status.h"

namespace flatshard::cuda {
namespace {

class CastKernelsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device on this machine";
  }
};

TEST(CudaLinkTest, NcclIsLinked) { EXPECT_GT(NcclVersion(), 0); }

TEST_F(CastKernelsTest, FloatTo16BitAndBackMatchesHost) {
  constexpr size_t kCount = 1 << 20;
  std::mt19937 rng(3);
  std::vector<float> host(kCount);
  for (float& x : host) {
    x = std::bit_cast<float>(static_cast<uint32_t>(rng()));
    if (std::isnan(x)) x = 1.0f;
  }
  float* d_src = nullptr;
  uint16_t* d_half = nullptr;
  float* d_back = nullptr;
  ASSERT_TRUE(CudaStatus(cudaMalloc(&d_src, kCount * 4), "malloc").ok());
  ASSERT_TRUE(CudaStatus(cudaMalloc(&d_half, kCount * 2), "malloc").ok());
  ASSERT_TRUE(CudaStatus(cudaMalloc(&d_back, kCount * 4), "malloc").ok());
  ASSERT_TRUE(
      CudaStatus(cudaMemcpy(d_src, host.data(), kCount * 4, cudaMemcpyHostToDevice), "copy").ok());
  for (DType low : {DType::kBFloat16, DType::kFloat16}) {
    ASSERT_TRUE(CastOnDevice(DType::kFloat32, d_src, low, d_half, kCount, nullptr).ok());
    ASSERT_TRUE(CastOnDevice(low, d_half, DType::kFloat32, d_back, kCount, nullptr).ok());
    std::vector<uint16_t> bits(kCount);
    std::vector<float> back(kCount);
    ASSERT_TRUE(
        CudaStatus(cudaMemcpy(bits.data(), d_half, kCount * 2, cudaMemcpyDeviceToHost), "copy")
            .ok());
    ASSERT_TRUE(
        CudaStatus(cudaMemcpy(back.data(), d_back, kCount * 4, cudaMemcpyDeviceToHost), "copy")
            .ok());
    for (size_t i = 0; i < kCount; ++i) {
      const uint16_t want =
          low == DType::kBFloat16 ? FloatToBFloat16(host[i]) : FloatToHalf(host[i]);
      ASSERT_EQ(bits[i], want) << DTypeName(low) << " at " << i;
      const float want_back = low == DType::kBFloat16 ? BFloat16ToFloat(want) : HalfToFloat(want);
      ASSERT_EQ(std::bit_cast<uint32_t>(back[i]), std::bit_cast<uint32_t>(want_back));
    }
  }
  EXPECT_FALSE(CastOnDevice(DType::kFloat64, d_src, DType::kFloat16, d_half, 1, nullptr).ok());
  cudaFree(d_src);
  cudaFree(d_half);
  cudaFree(d_back);
}

}  // namespace
}  // namespace flatshard::cuda
