#include "worker/device/host/host_softmax_kernels.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "worker/device/host/interleaved_sum.h"
#include "worker/device/host/libmvec_simd.h"
#include "worker/device/kernels/element_ops.h"

namespace flatshard::host_kernels {
namespace {

// The only per-ISA parts: the exponentials of a row.
// out[i] = expf(s[i] * scale - max)
using ScaledExpFn = void (*)(const float* s, size_t n, float scale, float max, float* out);
// out[i] = exp(double(z[i]) - max), in double
using ShiftedExpFn = void (*)(const float* z, size_t n, float max, double* out);

FLATSHARD_SCALAR void ScaledExpPortable(const float* s, size_t n, float scale, float max,
                                        float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = expf(s[i] * scale - max);
}

FLATSHARD_SCALAR void ShiftedExpPortable(const float* z, size_t n, float max, double* out) {
  for (size_t i = 0; i < n; ++i) out[i] = exp(static_cast<double>(z[i]) - max);
}

#if FLATSHARD_HAVE_LIBMVEC
[[gnu::target("avx2,fma")]] void ScaledExpAvx2(const float* s, size_t n, float scale, float max,
                                               float* out) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) out[i] = expf(s[i] * scale - max);
}

[[gnu::target("avx2,fma")]] void ShiftedExpAvx2(const float* z, size_t n, float max, double* out) {
#pragma omp simd
  for (size_t i = 0; i < n; ++i) out[i] = exp(static_cast<double>(z[i]) - max);
}
#else
// No vector exponentials here: the portable copies stand in.
void ScaledExpAvx2(const float* s, size_t n, float scale, float max, float* out) {
  ScaledExpPortable(s, n, scale, max, out);
}

void ShiftedExpAvx2(const float* z, size_t n, float max, double* out) {
  ShiftedExpPortable(z, n, max, out);
}
#endif

// The copy of an exponential loop `isa` runs.
template <typename Fn>
Fn ForIsa(HostIsa isa, Fn portable, Fn avx2) {
  return UseAvx2Fma(isa) ? avx2 : portable;
}

// The row's maximum of value(i), i < n, by `larger(a, b)` (which of two to
// keep), in interleaved lanes seeded with `seed`: the same result as a
// sequential scan for any order when `larger` ignores NaN candidates.
template <typename Value, typename Larger>
float InterleavedMax(size_t n, float seed, Value value, Larger larger) {
  float lane[kSumLanes];
  std::fill(lane, lane + kSumLanes, seed);
  size_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (size_t l = 0; l < kSumLanes; ++l) lane[l] = larger(lane[l], value(i + l));
  }
  for (size_t l = 0; i < n; ++i, ++l) lane[l] = larger(lane[l], value(i));
  float max = lane[0];
  for (size_t l = 1; l < kSumLanes; ++l) max = larger(max, lane[l]);
  return max;
}

}  // namespace

void CausalSoftmaxForward(const float* scores, size_t matrices, size_t seq, float scale,
                          float* probs, HostIsa isa) {
  const ScaledExpFn scaled_exp = ForIsa<ScaledExpFn>(isa, ScaledExpPortable, ScaledExpAvx2);
  // std::max keeps its first argument against a NaN: a NaN score is skipped
  // here and makes its own probability (and the row's sum) NaN below.
  const auto larger = [](float a, float b) { return std::max(a, b); };
  for (size_t m = 0; m < matrices; ++m) {
    for (size_t t = 0; t < seq; ++t) {
      const float* s = scores + (m * seq + t) * seq;
      float* p = probs + (m * seq + t) * seq;
      const size_t n = t + 1;  // softmax over t2 <= t, shifted by the max for stability
      const float max = InterleavedMax(
          n, -std::numeric_limits<float>::infinity(), [s, scale](size_t i) { return s[i] * scale; },
          larger);
      scaled_exp(s, n, scale, max, p);
      const float inv_sum = 1.0f / InterleavedSum<float>(n, [p](size_t i) { return p[i]; });
      for (size_t t2 = 0; t2 < n; ++t2) p[t2] *= inv_sum;
      std::fill(p + n, p + seq, 0.0f);
    }
  }
}

void CausalSoftmaxBackward(const float* probs, const float* dprobs, size_t matrices, size_t seq,
                           float scale, float* dscores) {
  for (size_t m = 0; m < matrices; ++m) {
    for (size_t t = 0; t < seq; ++t) {
      const float* p = probs + (m * seq + t) * seq;
      const float* dp = dprobs + (m * seq + t) * seq;
      float* ds = dscores + (m * seq + t) * seq;
      const size_t n = t + 1;
      const float weighted = InterleavedSum<float>(n, [p, dp](size_t i) { return p[i] * dp[i]; });
      for (size_t t2 = 0; t2 < n; ++t2) {
        ds[t2] = kernels::SoftmaxInputGrad(p[t2], dp[t2], weighted, scale);
      }
      std::fill(ds + n, ds + seq, 0.0f);
    }
  }
}

void CrossEntropyLoss(const float* logits, size_t rows, size_t classes, const int32_t* labels,
                      float* grad, double* loss, HostIsa isa) {
  const ShiftedExpFn shifted_exp = ForIsa<ShiftedExpFn>(isa, ShiftedExpPortable, ShiftedExpAvx2);
  // A NaN logit is skipped unless it comes first (then the max, and the row, are NaN).
  const auto larger = [](float a, float b) { return b > a ? b : a; };
  const double inv_rows = 1.0 / static_cast<double>(rows);
  // exp(z - max) in double a tile at a time: summed in double, and kept in
  // the gradient as the float it rounds to (ShiftedExp's value, within
  // libmvec's few ulp in the AVX2 copy) for the second pass.
  constexpr size_t kTile = 512;
  double tile[kTile];
  double total = 0.0;
  for (size_t r = 0; r < rows; ++r) {
    const float* z = logits + r * classes;
    float* g = grad + r * classes;
    const auto label = static_cast<size_t>(labels[r]);
    // log_softmax(z)[k] = z[k] - max - log(sum_j exp(z[j] - max))
    const float max = InterleavedMax(
        classes, z[0], [z](size_t k) { return z[k]; }, larger);
    // Read before `g` is written: the loss stays right even if a caller's
    // gradient buffer were its logits.
    const double label_shifted = double{z[label]} - max;
    double sum = 0.0;
    for (size_t k0 = 0; k0 < classes; k0 += kTile) {
      const size_t width = std::min(kTile, classes - k0);
      shifted_exp(z + k0, width, max, tile);
      sum += InterleavedSum<double>(width, [&tile](size_t i) { return tile[i]; });
      for (size_t i = 0; i < width; ++i) g[k0 + i] = static_cast<float>(tile[i]);
    }
    total += std::log(sum) - label_shifted;
    for (size_t k = 0; k < classes; ++k) {
      g[k] = kernels::CrossEntropyGrad(g[k], sum, k == label, inv_rows);
    }
  }
  *loss = total * inv_rows;
}

}  // namespace flatshard::host_kernels
