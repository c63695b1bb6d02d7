// The per-element arithmetic of the device kernels, written once
// (core/host_device.h): the host kernels (worker/device/host/host_kernels.cc, also
// run by the simulated device) loop over these functions and the CUDA kernels
// (worker/device/cuda/*.cu) call them per thread, so every device computes the
// same values element by element. Reductions (row statistics, norms) are
// organised differently per backend (loops on the host, CUB on the GPU); the
// element work around them is here, and so is the one order of column sums.
#ifndef FLATSHARD_WORKER_DEVICE_KERNELS_ELEMENT_OPS_H_
#define FLATSHARD_WORKER_DEVICE_KERNELS_ELEMENT_OPS_H_

#include <cmath>
#include <cstdint>

#include "core/dtype.h"
#include "core/float16.h"
#include "core/host_device.h"
#include "worker/device/stream.h"

namespace flatshard::kernels {

// ---- element storage by dtype (the floating dtypes the gradient path uses)

template <DType D>
struct Element;

template <>
struct Element<DType::kFloat32> {
  using Storage = float;
  FLATSHARD_HOST_DEVICE static float ToFloat(float v) { return v; }
  FLATSHARD_HOST_DEVICE static float FromFloat(float v) { return v; }
};

template <>
struct Element<DType::kBFloat16> {
  using Storage = uint16_t;
  FLATSHARD_HOST_DEVICE static float ToFloat(uint16_t v) { return BFloat16ToFloat(v); }
  FLATSHARD_HOST_DEVICE static uint16_t FromFloat(float v) { return FloatToBFloat16(v); }
};

template <>
struct Element<DType::kFloat16> {
  using Storage = uint16_t;
  FLATSHARD_HOST_DEVICE static float ToFloat(uint16_t v) { return HalfToFloat(v); }
  FLATSHARD_HOST_DEVICE static uint16_t FromFloat(float v) { return FloatToHalf(v); }
};

// dst[i] = dst dtype(src[i]) through float32.
template <DType Src, DType Dst>
FLATSHARD_HOST_DEVICE inline void CastElement(const typename Element<Src>::Storage* src,
                                              typename Element<Dst>::Storage* dst, size_t i) {
  dst[i] = Element<Dst>::FromFloat(Element<Src>::ToFloat(src[i]));
}

// Division by a gradient divide factor (docs/fsdp-semantics.md §3.2). torch
// divides; when the factor is a power of two (the pre-divide factor always is,
// and 1 means there is nothing to divide) the product with its inverse, which
// is exact, rounds the same real number and so equals the quotient bit for bit
// for every input, at the cost of a multiply rather than a division.
struct Divisor {
  float divisor = 1.0f;
  float inverse = 1.0f;  // 1 / divisor when that is exact, else 0

  // Host side: the factor as the kernels take it.
  static Divisor Of(double factor) {
    Divisor d;
    d.divisor = static_cast<float>(factor);
    int exponent = 0;
    const bool power_of_two = std::frexp(d.divisor, &exponent) == 0.5f;
    d.inverse = power_of_two ? 1.0f / d.divisor : 0.0f;
    return d;
  }
  FLATSHARD_HOST_DEVICE float operator()(float x) const {
    return inverse != 0.0f ? x * inverse : x / divisor;
  }
};
// The two cases of Divisor with the choice made, for host loops that decide it
// once per pass rather than per element (a GPU thread's uniform branch is free).
struct ByExactInverse {
  float inverse;
  FLATSHARD_HOST_DEVICE float operator()(float x) const { return x * inverse; }
};
struct ByDivision {
  float divisor;
  FLATSHARD_HOST_DEVICE float operator()(float x) const { return x / divisor; }
};

// docs/fsdp-semantics.md §3.2: the gradient is cast to the reduce dtype, padded
// with zeros to S*W and divided by the pre-divide factor in that dtype (torch's
// div_ on a 16-bit tensor computes in float32 and rounds back). One element of
// the unpadded gradient; the padding past it is zero.
template <DType D, typename Div>
FLATSHARD_HOST_DEVICE inline typename Element<D>::Storage PrepareGradValue(float grad,
                                                                           Div pre_divide) {
  const float rounded = Element<D>::ToFloat(Element<D>::FromFloat(grad));
  return Element<D>::FromFloat(pre_divide(rounded));
}

template <DType D>
FLATSHARD_HOST_DEVICE inline void PrepareGradElement(const float* grad, size_t grad_count,
                                                     typename Element<D>::Storage* out,
                                                     Divisor pre_divide, size_t i) {
  out[i] = i < grad_count ? PrepareGradValue<D>(grad[i], pre_divide) : Element<D>::FromFloat(0.0f);
}

// §3.2 post-divide in the reduce dtype, as the float32 added to the gradient
// shard.
template <DType D, typename Div>
FLATSHARD_HOST_DEVICE inline float PostDividedValue(typename Element<D>::Storage reduced,
                                                    Div post_divide) {
  return Element<D>::ToFloat(Element<D>::FromFloat(post_divide(Element<D>::ToFloat(reduced))));
}

// §3.5's accumulation into the fp32 gradient shard (_saved_grad_shard +=
// grad.to(float32)).
template <DType D, typename Div>
FLATSHARD_HOST_DEVICE inline void AccumulateReducedElement(
    const typename Element<D>::Storage* reduced, float* acc, Div post_divide, size_t i) {
  acc[i] += PostDividedValue<D>(reduced[i], post_divide);
}

// The same into a shard that holds nothing yet: what a zeroed shard would hold
// after it (0 + x, which turns -0 into +0), without reading it.
template <DType D, typename Div>
FLATSHARD_HOST_DEVICE inline void AssignReducedElement(const typename Element<D>::Storage* reduced,
                                                       float* acc, Div post_divide, size_t i) {
  acc[i] = 0.0f + PostDividedValue<D>(reduced[i], post_divide);
}

// ---- column sums: one order for every device
// A sum down the rows of a [rows, cols] matrix (a Linear's bias gradient,
// LayerNorm's weight and bias gradients) adds the rows in blocks of
// kColumnSumBlockRows: each block's rows in order starting from zero, then the
// blocks' sums in order onto the accumulator. Every device sums in this order,
// so they agree bit for bit and repeat from run to run; the blocks let a GPU
// give each (block, column) a thread, where one thread walking every row of a
// column left all but a few of its warps idle (the GPT's bias gradients were
// most of its step on an H100).
inline constexpr size_t kColumnSumBlockRows = 64;
FLATSHARD_HOST_DEVICE constexpr size_t ColumnSumBlocks(size_t rows) {
  return (rows + kColumnSumBlockRows - 1) / kColumnSumBlockRows;
}

// ---- activations

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // the N(0,1) density at 0
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluCubic = 0.044715f;

// torch.nn.GELU(approximate='none'): 0.5 x (1 + erf(x / sqrt 2)).
FLATSHARD_HOST_DEVICE inline float GeluErf(float x) {
  return 0.5f * x * (1.0f + erff(x * kInvSqrt2));
}

// d/dx of GeluErf = Phi(x) + x phi(x).
FLATSHARD_HOST_DEVICE inline float GeluErfGrad(float x) {
  const float cdf = 0.5f * (1.0f + erff(x * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * expf(-0.5f * x * x);
  return cdf + x * pdf;
}

// tanh for GELU. On the host, through one expf: glibc's tanhf goes through
// expm1f and was a third of the byte-level GPT's CPU step (perf: __expm1f 24 %,
// __tanhf 9 %), expf is a few times cheaper. 1 - 2 / (e^2u + 1) is exact at the
// limits (e^2u overflows to inf: 1; underflows to 0: -1) and within 1.2e-7 of
// tanhf in absolute terms, which is what GELU's 0.5 x (1 + t) sees. GPUs keep
// their own tanhf.
FLATSHARD_HOST_DEVICE inline float GeluTanhOf(float u) {
#ifdef __CUDA_ARCH__
  return tanhf(u);
#else
  return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
#endif
}

// torch.nn.GELU(approximate='tanh'): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
FLATSHARD_HOST_DEVICE inline float GeluTanh(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + GeluTanhOf(u));
}

FLATSHARD_HOST_DEVICE inline float GeluTanhGrad(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float t = GeluTanhOf(u);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

FLATSHARD_HOST_DEVICE inline float ActivationValue(Activation kind, float x) {
  switch (kind) {
    case Activation::kRelu:
      return x > 0.0f ? x : 0.0f;
    case Activation::kGeluErf:
      return GeluErf(x);
    case Activation::kGeluTanh:
      return GeluTanh(x);
  }
  return x;
}

// dx from dy and what the forward saved (x for GELU, y for ReLU; torch's ReLU
// gradient at 0 is 0).
FLATSHARD_HOST_DEVICE inline float ActivationGradient(Activation kind, float saved, float dy) {
  switch (kind) {
    case Activation::kRelu:
      return saved > 0.0f ? dy : 0.0f;
    case Activation::kGeluErf:
      return dy * GeluErfGrad(saved);
    case Activation::kGeluTanh:
      return dy * GeluTanhGrad(saved);
  }
  return dy;
}

// ---- LayerNorm: row statistics are reduced per backend, in double; the element
// work is here.

// rstd from the row's biased variance: 1 / sqrt(var + eps), as a float.
FLATSHARD_HOST_DEVICE inline float LayerNormRstd(double variance, double eps) {
  return static_cast<float>(1.0 / sqrt(variance + eps));
}

// xhat = (x - mean) * rstd; y = xhat * w + b (w, b may be null).
FLATSHARD_HOST_DEVICE inline void LayerNormForwardElement(const float* x, double mean, float rstd,
                                                          const float* w, const float* b,
                                                          float* xhat, float* y, int64_t i) {
  const float normed = static_cast<float>(x[i] - mean) * rstd;
  xhat[i] = normed;
  y[i] = normed * (w != nullptr ? w[i] : 1.0f) + (b != nullptr ? b[i] : 0.0f);
}

// dnorm = dy * w, the quantity whose row means the backward needs.
FLATSHARD_HOST_DEVICE inline float LayerNormDnorm(const float* dy, const float* w, int64_t i) {
  return dy[i] * (w != nullptr ? w[i] : 1.0f);
}

// dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat)).
FLATSHARD_HOST_DEVICE inline float LayerNormInputGrad(float dnorm, float xhat, float rstd,
                                                      double mean_dnorm, double mean_dnorm_xhat) {
  return rstd * static_cast<float>(dnorm - mean_dnorm - xhat * mean_dnorm_xhat);
}

// ---- softmax and cross-entropy

// The causal softmax's backward for one element of a row, given
// weighted = sum_t2 probs[t2] * dprobs[t2] over the row.
FLATSHARD_HOST_DEVICE inline float SoftmaxInputGrad(float prob, float dprob, float weighted,
                                                    float scale) {
  return prob * (dprob - weighted) * scale;
}

// exp(z[k] - max) computed in double and kept as a float, the unnormalised
// softmax the gradient is formed from.
FLATSHARD_HOST_DEVICE inline float ShiftedExp(float z, float max) {
  return static_cast<float>(exp(static_cast<double>(z) - max));
}

// d(mean CE)/dz[k] = (softmax[k] - [k == label]) / rows, from ShiftedExp and the
// row's sum of exp(z - max) in double.
FLATSHARD_HOST_DEVICE inline float CrossEntropyGrad(float shifted_exp, double sum, bool is_label,
                                                    double inv_rows) {
  return static_cast<float>((shifted_exp / sum - (is_label ? 1.0 : 0.0)) * inv_rows);
}

}  // namespace flatshard::kernels

#endif  // FLATSHARD_WORKER_DEVICE_KERNELS_ELEMENT_OPS_H_
