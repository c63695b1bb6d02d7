// Elementwise kernels: casts, the FSDP gradient path (docs/fsdp-semantics.md §3.2,
// §3.5), activations, Add and the optimizer steps. Each thread applies the shared
// element body to its indices, so these match the host bit for bit (the
// transcendental functions of GELU aside: CUDA's erff/expf/tanhf and the host's
// libm may differ in the last bits).
#include "core/float16.h"
#include "core/optimizer_update.h"
#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/launch_config.cuh"
#include "worker/device/kernels/element_ops.h"

namespace flatshard::cuda {
namespace {

using kernels::Element;

// ---- casts between any two floating dtypes, as core/dtype.cc's
// ConvertElements: the four float32 <-> 16-bit casts through the shared element
// body, every other pair through double (float64 -> 16-bit rounds via float32).

template <DType D>
struct Storage {
  using Type = typename Element<D>::Storage;
};
template <>
struct Storage<DType::kFloat64> {
  using Type = double;
};

template <DType D>
__device__ double ReadAsDouble(const typename Storage<D>::Type* data, size_t i) {
  if constexpr (D == DType::kFloat64) {
    return data[i];
  } else {
    return static_cast<double>(Element<D>::ToFloat(data[i]));
  }
}

template <DType D>
__device__ void WriteFromDouble(typename Storage<D>::Type* data, size_t i, double value) {
  if constexpr (D == DType::kFloat64) {
    data[i] = value;
  } else {
    data[i] = Element<D>::FromFloat(static_cast<float>(value));
  }
}

template <DType Src, DType Dst>
constexpr bool kThroughFloat = (Src == DType::kFloat32 &&
                                (Dst == DType::kBFloat16 || Dst == DType::kFloat16)) ||
                               (Dst == DType::kFloat32 &&
                                (Src == DType::kBFloat16 || Src == DType::kFloat16));

template <DType Src, DType Dst>
__global__ void CastKernel(const typename Storage<Src>::Type* src, typename Storage<Dst>::Type* dst,
                           size_t count) {
  for (size_t i = FirstIndex(); i < count; i += GridStride()) {
    if constexpr (kThroughFloat<Src, Dst>) {
      kernels::CastElement<Src, Dst>(src, dst, i);
    } else {
      WriteFromDouble<Dst>(dst, i, ReadAsDouble<Src>(src, i));
    }
  }
}

template <DType Src, DType Dst>
cudaError_t CastPair(const void* src, void* dst, size_t count, cudaStream_t stream) {
  CastKernel<Src, Dst><<<BlocksFor(count), kThreads, 0, stream>>>(
      static_cast<const typename Storage<Src>::Type*>(src),
      static_cast<typename Storage<Dst>::Type*>(dst), count);
  return cudaGetLastError();
}

template <DType Src>
cudaError_t CastFrom(const void* src, DType dst_dtype, void* dst, size_t count,
                     cudaStream_t stream) {
  switch (dst_dtype) {
    case DType::kFloat32:
      return CastPair<Src, DType::kFloat32>(src, dst, count, stream);
    case DType::kFloat64:
      return CastPair<Src, DType::kFloat64>(src, dst, count, stream);
    case DType::kFloat16:
      return CastPair<Src, DType::kFloat16>(src, dst, count, stream);
    case DType::kBFloat16:
      return CastPair<Src, DType::kBFloat16>(src, dst, count, stream);
    default:
      return cudaErrorInvalidValue;  // not floating: refused by stream_checks
  }
}

// ---- the gradient path

template <DType D>
__global__ void PrepareGradKernel(const float* grad, size_t grad_count,
                                  typename Element<D>::Storage* out, size_t out_count,
                                  kernels::Divisor pre_divide) {
  for (size_t i = FirstIndex(); i < out_count; i += GridStride()) {
    kernels::PrepareGradElement<D>(grad, grad_count, out, pre_divide, i);
  }
}

template <DType D>
cudaError_t PrepareGrad(const float* grad, size_t grad_count, void* out, size_t out_count,
                        float pre_divide, cudaStream_t stream) {
  PrepareGradKernel<D><<<BlocksFor(out_count), kThreads, 0, stream>>>(
      grad, grad_count, static_cast<typename Element<D>::Storage*>(out), out_count,
      kernels::Divisor::Of(pre_divide));
  return cudaGetLastError();
}

template <DType D>
__global__ void AccumulateReducedKernel(const typename Element<D>::Storage* reduced, float* acc,
                                        size_t count, kernels::Divisor post_divide) {
  for (size_t i = FirstIndex(); i < count; i += GridStride()) {
    kernels::AccumulateReducedElement<D>(reduced, acc, post_divide, i);
  }
}

template <DType D>
cudaError_t AccumulateReduced(const void* reduced, float* acc, size_t count, float post_divide,
                              cudaStream_t stream) {
  AccumulateReducedKernel<D><<<BlocksFor(count), kThreads, 0, stream>>>(
      static_cast<const typename Element<D>::Storage*>(reduced), acc, count,
      kernels::Divisor::Of(post_divide));
  return cudaGetLastError();
}

// ---- layers and optimizers

__global__ void ActivationForwardKernel(Activation kind, const float* x, float* y, size_t count) {
  for (size_t i = FirstIndex(); i < count; i += GridStride()) {
    y[i] = kernels::ActivationValue(kind, x[i]);
  }
}

__global__ void ActivationBackwardKernel(Activation kind, const float* saved, const float* dy,
                                         float* dx, size_t count) {
  for (size_t i = FirstIndex(); i < count; i += GridStride()) {
    dx[i] = kernels::ActivationGradient(kind, saved[i], dy[i]);
  }
}

__global__ void AddKernel(float* acc, const float* x, size_t count) {
  for (size_t i = FirstIndex(); i < count; i += GridStride()) acc[i] += x[i];
}

__global__ void SgdKernel(SgdCoefficients c, float* params, const float* grads, float* momentum,
                          size_t count) {
  for (size_t i = FirstIndex(); i < count; i += GridStride()) {
    float no_momentum = 0.0f;
    SgdUpdate(c, params[i], grads[i], momentum != nullptr ? momentum[i] : no_momentum);
  }
}

__global__ void AdamKernel(AdamCoefficients c, float* params, const float* grads, float* exp_avg,
                           float* exp_avg_sq, float* max_exp_avg_sq, size_t count) {
  for (size_t i = FirstIndex(); i < count; i += GridStride()) {
    float no_max = 0.0f;
    AdamUpdate(c, params[i], grads[i], exp_avg[i], exp_avg_sq[i],
               max_exp_avg_sq != nullptr ? max_exp_avg_sq[i] : no_max);
  }
}

}  // namespace

cudaError_t LaunchCast(DType src_dtype, const void* src, DType dst_dtype, void* dst, size_t count,
                       cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ClearStaleError();
  switch (src_dtype) {
    case DType::kFloat32:
      return CastFrom<DType::kFloat32>(src, dst_dtype, dst, count, stream);
    case DType::kFloat64:
      return CastFrom<DType::kFloat64>(src, dst_dtype, dst, count, stream);
    case DType::kFloat16:
      return CastFrom<DType::kFloat16>(src, dst_dtype, dst, count, stream);
    case DType::kBFloat16:
      return CastFrom<DType::kBFloat16>(src, dst_dtype, dst, count, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchPrepareGradForReduce(const float* grad, size_t grad_count, DType reduce_dtype,
                                       void* out, size_t out_count, float pre_divide,
                                       cudaStream_t stream) {
  if (out_count == 0) return cudaSuccess;
  ClearStaleError();
  switch (reduce_dtype) {
    case DType::kBFloat16:
      return PrepareGrad<DType::kBFloat16>(grad, grad_count, out, out_count, pre_divide, stream);
    case DType::kFloat16:
      return PrepareGrad<DType::kFloat16>(grad, grad_count, out, out_count, pre_divide, stream);
    case DType::kFloat32:
      return PrepareGrad<DType::kFloat32>(grad, grad_count, out, out_count, pre_divide, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchAccumulateReducedGrad(DType reduce_dtype, const void* reduced, float* acc,
                                        size_t count, float post_divide, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ClearStaleError();
  switch (reduce_dtype) {
    case DType::kBFloat16:
      return AccumulateReduced<DType::kBFloat16>(reduced, acc, count, post_divide, stream);
    case DType::kFloat16:
      return AccumulateReduced<DType::kFloat16>(reduced, acc, count, post_divide, stream);
    case DType::kFloat32:
      return AccumulateReduced<DType::kFloat32>(reduced, acc, count, post_divide, stream);
    default:
      return cudaErrorInvalidValue;
  }
}

cudaError_t LaunchActivationForward(Activation kind, const float* x, float* y, size_t count,
                                    cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ClearStaleError();
  ActivationForwardKernel<<<BlocksFor(count), kThreads, 0, stream>>>(kind, x, y, count);
  return cudaGetLastError();
}

cudaError_t LaunchActivationBackward(Activation kind, const float* saved, const float* dy,
                                     float* dx, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ClearStaleError();
  ActivationBackwardKernel<<<BlocksFor(count), kThreads, 0, stream>>>(kind, saved, dy, dx, count);
  return cudaGetLastError();
}

cudaError_t LaunchAdd(float* acc, const float* x, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ClearStaleError();
  AddKernel<<<BlocksFor(count), kThreads, 0, stream>>>(acc, x, count);
  return cudaGetLastError();
}

cudaError_t LaunchSgdStep(const SgdCoefficients& c, float* params, const float* grads,
                          float* momentum, size_t count, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ClearStaleError();
  SgdKernel<<<BlocksFor(count), kThreads, 0, stream>>>(c, params, grads, momentum, count);
  return cudaGetLastError();
}

cudaError_t LaunchAdamStep(const AdamCoefficients& c, float* params, const float* grads,
                           float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq, size_t count,
                           cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ClearStaleError();
  AdamKernel<<<BlocksFor(count), kThreads, 0, stream>>>(c, params, grads, exp_avg, exp_avg_sq,
                                                        max_exp_avg_sq, count);
  return cudaGetLastError();
}

}  // namespace flatshard::cuda
