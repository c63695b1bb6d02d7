// The column-sum order every device shares (kernels::ColumnSumBlocks): the
// host's bias and LayerNorm parameter gradients add their rows in blocks of
// kColumnSumBlockRows from zero, then the blocks in order onto the
// accumulator. The CUDA kernels sum in parallel in this same order
// (cuda_stream_test compares them bit for bit on a GPU); this pins the host's
// side on every machine, against the order written out independently here.
#include <bit>
#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

#include "worker/device/host/host_kernels.h"
#include "worker/device/kernels/element_ops.h"

namespace flatshard::host_kernels {
namespace {

std::vector<float> Normal(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// out[c] + (block 0's sum) + (block 1's sum) + ..., each block from zero.
std::vector<float> BlockOrder(const std::vector<float>& x, const std::vector<float>* y, size_t rows,
                              size_t cols, std::vector<float> out) {
  const size_t block_rows = kernels::kColumnSumBlockRows;
  for (size_t c = 0; c < cols; ++c) {
    for (size_t k = 0; k < kernels::ColumnSumBlocks(rows); ++k) {
      float sum = 0.0f;
      for (size_t r = k * block_rows; r < rows && r < (k + 1) * block_rows; ++r) {
        const float term = y == nullptr ? x[r * cols + c] : x[r * cols + c] * (*y)[r * cols + c];
        sum += term;
      }
      out[c] += sum;
    }
  }
  return out;
}

void ExpectBits(const std::vector<float>& got, const std::vector<float>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::bit_cast<uint32_t>(got[i]), std::bit_cast<uint32_t>(want[i]))
        << what << " column " << i << ": " << got[i] << " vs " << want[i];
  }
}

TEST(HostColumnSumsTest, BiasGradientsAddTheRowsInBlocks) {
  // Narrow, and wider than the host's column tile (partial last tile).
  for (const size_t cols : {size_t{37}, size_t{1029}}) {
    // One partial block, exact blocks, and several blocks with a partial last.
    for (const size_t rows : {size_t{1}, size_t{64}, size_t{128}, size_t{1000}}) {
      SCOPED_TRACE(testing::Message() << rows << " x " << cols);
      const std::vector<float> x = Normal(rows * cols, 3);
      std::vector<float> out = Normal(cols, 4);
      const std::vector<float> want = BlockOrder(x, nullptr, rows, cols, out);
      AccumulateColumnSums(x.data(), rows, out.data(), cols);
      ExpectBits(out, want, "bias grad");
    }
  }
  std::vector<float> untouched = Normal(37, 5);
  const std::vector<float> before = untouched;
  AccumulateColumnSums(nullptr, 0, untouched.data(), 37);
  ExpectBits(untouched, before, "no rows");
}

TEST(HostColumnSumsTest, LayerNormParameterGradientsAddTheRowsInBlocks) {
  constexpr size_t kRows = 200, kDim = 24;
  const std::vector<float> dy = Normal(kRows * kDim, 6), xhat = Normal(kRows * kDim, 7);
  const std::vector<float> rstd(kRows, 1.0f), weight = Normal(kDim, 8);
  std::vector<float> dx(kRows * kDim), weight_grad = Normal(kDim, 9), bias_grad = Normal(kDim, 10);
  const std::vector<float> want_w = BlockOrder(dy, &xhat, kRows, kDim, weight_grad);
  const std::vector<float> want_b = BlockOrder(dy, nullptr, kRows, kDim, bias_grad);
  LayerNormBackward(dy.data(), xhat.data(), rstd.data(), kRows, kDim, weight.data(), dx.data(),
                    weight_grad.data(), bias_grad.data());
  ExpectBits(weight_grad, want_w, "weight grad");
  ExpectBits(bias_grad, want_b, "bias grad");
}

}  // namespace
}  // namespace flatshard::host_kernels
