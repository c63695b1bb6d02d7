// The host collectives' elementwise combines (worker/comm/reduce_kernels.h):
// the 16-bit ones are compiled for the baseline and for AVX2, and both copies
// must give the same bits, on what rounding treats specially, in place and
// out of place; and the values are the float32 operation rounded back.
#include "worker/comm/reduce_kernels.h"

#include <bit>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "core/float16.h"

namespace flatshard {
namespace {

using host_kernels::HostIsa;

// Every 16-bit pattern once, against a shuffled copy: zeros, subnormals,
// infinities, NaNs with every payload, and ties.
std::vector<uint16_t> AllPatterns(uint32_t stride) {
  std::vector<uint16_t> v(65536);
  for (uint32_t i = 0; i < 65536; ++i) v[i] = static_cast<uint16_t>(i * stride);
  return v;
}

TEST(ReduceKernelsTest, SixteenBitCopiesAgreeAndRoundTheFloatResult) {
  const std::vector<uint16_t> x = AllPatterns(1), y = AllPatterns(40503);  // odd: a permutation
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMax}) {
      std::vector<uint16_t> portable(x.size()), avx2 = x;
      ReduceElements(dtype, op, x.data(), y.data(), portable.data(), x.size(), HostIsa::kPortable);
      if (host_kernels::HostIsaSupported(HostIsa::kAvx2Fma)) {
        // In place (out aliases a), as the ring calls it.
        ReduceElements(dtype, op, avx2.data(), y.data(), avx2.data(), x.size(), HostIsa::kAvx2Fma);
        EXPECT_EQ(portable, avx2) << DTypeName(dtype) << (op == ReduceOp::kSum ? " sum" : " max");
      }
      const bool bf16 = dtype == DType::kBFloat16;
      for (size_t i = 0; i < x.size(); i += 97) {
        const float a = bf16 ? BFloat16ToFloat(x[i]) : HalfToFloat(x[i]);
        const float b = bf16 ? BFloat16ToFloat(y[i]) : HalfToFloat(y[i]);
        const float r = op == ReduceOp::kSum ? a + b : std::max(a, b);
        EXPECT_EQ(portable[i], bf16 ? FloatToBFloat16(r) : FloatToHalf(r)) << "element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace flatshard
