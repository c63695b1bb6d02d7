#include "worker/device/host/host_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/clip_grad_norm_math.h"
#include "worker/device/host/cblas_api.h"
#include "worker/device/host/host_gelu_kernels.h"
#include "worker/device/host/interleaved_sum.h"
#include "worker/device/kernels/element_ops.h"

namespace flatshard::host_kernels {
namespace {

using kernels::Element;

// BLAS takes int dimensions; shapes here are far below 2^31 (layers check theirs).
blasint B(int64_t n) { return static_cast<blasint>(n); }

template <DType Src, DType Dst>
void CastLoop(const std::byte* src, std::byte* dst, size_t count) {
  const auto* s = reinterpret_cast<const typename Element<Src>::Storage*>(src);
  auto* d = reinterpret_cast<typename Element<Dst>::Storage*>(dst);
  for (size_t i = 0; i < count; ++i) kernels::CastElement<Src, Dst>(s, d, i);
}

// The gradient and its padding in two loops, and the divisor's case decided
// once per pass: a per-element branch would keep these hot loops (one pass over
// every gradient each) from being straight lines.
template <typename Loop>
void WithDivisor(kernels::Divisor d, Loop&& loop) {
  if (d.inverse != 0.0f) {
    loop(kernels::ByExactInverse{d.inverse});
  } else {
    loop(kernels::ByDivision{d.divisor});
  }
}

template <DType D>
void PrepareLoop(const float* grad, size_t grad_count, std::byte* out, size_t out_count,
                 kernels::Divisor pre) {
  auto* o = reinterpret_cast<typename Element<D>::Storage*>(out);
  const size_t n = std::min(grad_count, out_count);
  WithDivisor(pre, [&](auto divide) {
    for (size_t i = 0; i < n; ++i) o[i] = kernels::PrepareGradValue<D>(grad[i], divide);
  });
  for (size_t i = n; i < out_count; ++i) o[i] = Element<D>::FromFloat(0.0f);
}

template <DType D>
void AccumulateLoop(const std::byte* reduced, float* acc, size_t count, kernels::Divisor post) {
  const auto* r = reinterpret_cast<const typename Element<D>::Storage*>(reduced);
  WithDivisor(post, [&](auto divide) {
    for (size_t i = 0; i < count; ++i) kernels::AccumulateReducedElement<D>(r, acc, divide, i);
  });
}

}  // namespace

void Cast(DType src_dtype, const std::byte* src, DType dst_dtype, std::byte* dst, size_t count) {
  constexpr DType kF32 = DType::kFloat32, kBF16 = DType::kBFloat16, kF16 = DType::kFloat16;
  if (src_dtype == kF32 && dst_dtype == kBF16) return CastLoop<kF32, kBF16>(src, dst, count);
  if (src_dtype == kBF16 && dst_dtype == kF32) return CastLoop<kBF16, kF32>(src, dst, count);
  if (src_dtype == kF32 && dst_dtype == kF16) return CastLoop<kF32, kF16>(src, dst, count);
  if (src_dtype == kF16 && dst_dtype == kF32) return CastLoop<kF16, kF32>(src, dst, count);
  // Equal dtypes (a copy) and the rest: core's conversions.
  ConvertElements(src_dtype, src, dst_dtype, dst, count);
}

void PrepareGradForReduce(const float* grad, size_t grad_count, DType reduce_dtype, std::byte* out,
                          size_t out_count, double pre_divide) {
  const kernels::Divisor pre = kernels::Divisor::Of(pre_divide);
  switch (reduce_dtype) {
    case DType::kBFloat16:
      return PrepareLoop<DType::kBFloat16>(grad, grad_count, out, out_count, pre);
    case DType::kFloat16:
      return PrepareLoop<DType::kFloat16>(grad, grad_count, out, out_count, pre);
    default:
      return PrepareLoop<DType::kFloat32>(grad, grad_count, out, out_count, pre);
  }
}

void AccumulateReducedGrad(DType reduce_dtype, const std::byte* reduced, float* acc, size_t count,
                           double post_divide) {
  const kernels::Divisor post = kernels::Divisor::Of(post_divide);
  switch (reduce_dtype) {
    case DType::kBFloat16:
      return AccumulateLoop<DType::kBFloat16>(reduced, acc, count, post);
    case DType::kFloat16:
      return AccumulateLoop<DType::kFloat16>(reduced, acc, count, post);
    default:
      return AccumulateLoop<DType::kFloat32>(reduced, acc, count, post);
  }
}

void Gemm(const HostGemm& gemm) {
  const GemmArgs& g = *gemm.args;
  for (int64_t i = 0; i < g.batch; ++i) {
    Cblas().sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans,
                  g.trans_b ? CblasTrans : CblasNoTrans, B(g.m), B(g.n), B(g.k), g.alpha,
                  gemm.a + i * g.stride_a, B(g.lda), gemm.b + i * g.stride_b, B(g.ldb), g.beta,
                  gemm.c + i * g.stride_c, B(g.ldc));
  }
}

void AddBias(float* y, size_t rows, const float* bias, size_t cols) {
  for (size_t r = 0; r < rows; ++r) {
    float* row = y + r * cols;
    for (size_t c = 0; c < cols; ++c) row[c] += bias[c];
  }
}

namespace {

// out[c] += the column sums of `rows` rows of `cols`, in kernels::ColumnSumBlocks'
// order; a row's term is x[r, c], or x[r, c] * y[r, c] when `y` is given.
// Columns go in tiles whose block sums live on the stack: this runs in every
// Linear's and LayerNorm's backward, where a heap buffer per call would cost.
void AddColumnSumsInBlocks(const float* x, const float* y, size_t rows, float* out, size_t cols) {
  constexpr size_t kTile = 512;
  float block[kTile];
  for (size_t c0 = 0; c0 < cols; c0 += kTile) {
    const size_t width = std::min(kTile, cols - c0);
    for (size_t r0 = 0; r0 < rows; r0 += kernels::kColumnSumBlockRows) {
      const size_t r1 = std::min(rows, r0 + kernels::kColumnSumBlockRows);
      std::fill(block, block + width, 0.0f);
      for (size_t r = r0; r < r1; ++r) {
        const float* xr = x + r * cols + c0;
        if (y == nullptr) {
          for (size_t c = 0; c < width; ++c) block[c] += xr[c];
        } else {
          const float* yr = y + r * cols + c0;
          for (size_t c = 0; c < width; ++c) block[c] += xr[c] * yr[c];
        }
      }
      for (size_t c = 0; c < width; ++c) out[c0 + c] += block[c];
    }
  }
}

}  // namespace

void AccumulateColumnSums(const float* x, size_t rows, float* out, size_t cols) {
  AddColumnSumsInBlocks(x, nullptr, rows, out, cols);
}

void ActivationForward(Activation kind, const float* x, float* y, size_t count) {
  if (kind == Activation::kGeluTanh) return GeluTanhForward(x, y, count);  // vector expf
  for (size_t i = 0; i < count; ++i) y[i] = kernels::ActivationValue(kind, x[i]);
}

void ActivationBackward(Activation kind, const float* saved, const float* dy, float* dx,
                        size_t count) {
  if (kind == Activation::kGeluTanh) return GeluTanhBackward(saved, dy, dx, count);
  for (size_t i = 0; i < count; ++i) dx[i] = kernels::ActivationGradient(kind, saved[i], dy[i]);
}

void Add(float* acc, const float* x, size_t count) {
  for (size_t i = 0; i < count; ++i) acc[i] += x[i];
}

void AddRowsModulo(float* x, size_t rows, const float* table, size_t period, size_t cols) {
  for (size_t r = 0; r < rows; ++r) {
    float* row = x + r * cols;
    const float* add = table + (r % period) * cols;
    for (size_t c = 0; c < cols; ++c) row[c] += add[c];
  }
}

void SumRowsModulo(const float* x, size_t rows, size_t period, size_t cols, float* out) {
  std::fill(out, out + period * cols, 0.0f);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = x + r * cols;
    float* sum = out + (r % period) * cols;
    for (size_t c = 0; c < cols; ++c) sum[c] += row[c];
  }
}

void LayerNormForward(const float* x, size_t rows, size_t dim, const float* weight,
                      const float* bias, double eps, float* y, float* xhat, float* rstd) {
  for (size_t r = 0; r < rows; ++r) {
    const float* xr = x + r * dim;
    // Row statistics in double: cheap, and var = E[(x - mean)^2] stays accurate.
    // (A double sum of n floats is exact in any order while their exponents
    // span less than 29 - log2(n) binades, ~22 at n = 128, so the interleaving
    // rarely moves even the mean's bits.)
    const double mean = InterleavedSum<double>(dim, [xr](size_t i) { return double{xr[i]}; }) /
                        static_cast<double>(dim);
    const double var = InterleavedSum<double>(dim,
                                              [xr, mean](size_t i) {
                                                const double centered = xr[i] - mean;
                                                return centered * centered;
                                              }) /
                       static_cast<double>(dim);  // biased, as torch
    const float row_rstd = kernels::LayerNormRstd(var, eps);
    rstd[r] = row_rstd;
    for (size_t i = 0; i < dim; ++i) {
      kernels::LayerNormForwardElement(xr, mean, row_rstd, weight, bias, xhat + r * dim,
                                       y + r * dim, static_cast<int64_t>(i));
    }
  }
}

void LayerNormBackward(const float* dy, const float* xhat, const float* rstd, size_t rows,
                       size_t dim, const float* weight, float* dx, float* weight_grad,
                       float* bias_grad) {
  for (size_t r = 0; r < rows; ++r) {
    const float* dyr = dy + r * dim;
    const float* xr = xhat + r * dim;
    const auto dnorm = [dyr, weight](size_t i) {
      return kernels::LayerNormDnorm(dyr, weight, static_cast<int64_t>(i));
    };
    const double mean_dnorm =
        InterleavedSum<double>(dim, [&dnorm](size_t i) { return double{dnorm(i)}; }) /
        static_cast<double>(dim);
    const double mean_dnorm_xhat =
        InterleavedSum<double>(dim, [&dnorm, xr](size_t i) { return double{dnorm(i) * xr[i]}; }) /
        static_cast<double>(dim);
    float* dxr = dx + r * dim;
    for (size_t i = 0; i < dim; ++i) {
      dxr[i] = kernels::LayerNormInputGrad(dnorm(i), xr[i], rstd[r], mean_dnorm, mean_dnorm_xhat);
    }
  }
  // dw += sum_rows dy * xhat; db += sum_rows dy, in the column-sum order.
  if (weight_grad != nullptr) AddColumnSumsInBlocks(dy, xhat, rows, weight_grad, dim);
  if (bias_grad != nullptr) AddColumnSumsInBlocks(dy, nullptr, rows, bias_grad, dim);
}

void EmbeddingForward(const int32_t* ids, size_t count, const float* table, size_t dim,
                      float* out) {
  for (size_t i = 0; i < count; ++i) {
    const float* row = table + static_cast<size_t>(ids[i]) * dim;
    std::copy(row, row + dim, out + i * dim);
  }
}

void EmbeddingBackward(const int32_t* ids, size_t count, const float* dout, size_t dim,
                       float* table_grad) {
  for (size_t i = 0; i < count; ++i) {
    float* g = table_grad + static_cast<size_t>(ids[i]) * dim;
    const float* dy = dout + i * dim;
    for (size_t j = 0; j < dim; ++j) g[j] += dy[j];
  }
}

void SplitHeads(const float* rows, const HeadLayout& l, float* heads) {
  const auto hd = static_cast<size_t>(l.head_dim);
  for (int64_t b = 0; b < l.batch; ++b) {
    for (int64_t h = 0; h < l.heads; ++h) {
      for (int64_t t = 0; t < l.seq; ++t) {
        const float* src = rows + (b * l.seq + t) * l.row_stride + l.col_offset + h * l.head_dim;
        float* dst = heads + ((b * l.heads + h) * l.seq + t) * l.head_dim;
        std::copy(src, src + hd, dst);
      }
    }
  }
}

void MergeHeads(const float* heads, const HeadLayout& l, float* rows) {
  const auto hd = static_cast<size_t>(l.head_dim);
  for (int64_t b = 0; b < l.batch; ++b) {
    for (int64_t h = 0; h < l.heads; ++h) {
      for (int64_t t = 0; t < l.seq; ++t) {
        const float* src = heads + ((b * l.heads + h) * l.seq + t) * l.head_dim;
        float* dst = rows + (b * l.seq + t) * l.row_stride + l.col_offset + h * l.head_dim;
        std::copy(src, src + hd, dst);
      }
    }
  }
}

void MseLoss(const float* out, const float* target, size_t count, float* grad, double* loss) {
  const auto n = static_cast<double>(count);
  double sum = 0.0;
  for (size_t i = 0; i < count; ++i) {
    const double diff = double{out[i]} - double{target[i]};
    sum += diff * diff;
    grad[i] = static_cast<float>(2.0 * diff / n);
  }
  *loss = sum / n;
}

double GradAbsPowSum(const float* grads, size_t count, double norm_type) {
  double sum = 0.0;
  for (size_t i = 0; i < count; ++i) sum += clip_math::AbsPow(grads[i], norm_type);
  return sum;
}

double GradAbsMax(const float* grads, size_t count) {
  double max = 0.0;
  for (size_t i = 0; i < count; ++i) max = clip_math::NaNMax(max, std::fabs(double{grads[i]}));
  return max;
}

void ScaleGrads(float* grads, size_t count, float coef) {
  for (size_t i = 0; i < count; ++i) grads[i] *= coef;
}

}  // namespace flatshard::host_kernels
