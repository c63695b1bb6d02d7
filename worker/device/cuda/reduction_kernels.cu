// Whole-tensor reductions without floating-point atomics, so they repeat bit for
// bit from run to run: a fixed grid of kReductionBlocks blocks walks the tensor
// in grid-stride order and writes one partial per block (cub::BlockReduce), and
// a single block combines the partials. Used by the MSE loss and by
// clip_grad_norm_ (docs/fsdp-semantics.md §8), whose per-tensor and cross-tensor
// arithmetic is core/clip_grad_norm_math.h's.
#include <cmath>

#include "core/clip_grad_norm_math.h"
#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/launch_config.cuh"

namespace flatshard::cuda {
namespace {

struct NaNMaxOp {
  __device__ double operator()(double a, double b) const { return clip_math::NaNMax(a, b); }
};

// grad[i] = 2 (out[i] - target[i]) / n and the block's sum of squared
// differences, in double as the host.
__global__ void MsePartialsKernel(const float* out, const float* target, size_t count, float* grad,
                                  double* partials) {
  __shared__ typename BlockReduce<double>::TempStorage temp;
  const auto n = static_cast<double>(count);
  double sum = 0.0;
  for (size_t i = FirstIndex(); i < count; i += GridStride()) {
    const double diff = static_cast<double>(out[i]) - static_cast<double>(target[i]);
    sum += diff * diff;
    grad[i] = static_cast<float>(2.0 * diff / n);
  }
  const double block_sum = BlockReduce<double>(temp).Sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

// One block: the sum of kReductionBlocks partials, in a fixed order.
__device__ double SumPartials(const double* partials,
                              typename BlockReduce<double>::TempStorage& temp, double& shared) {
  double sum = 0.0;
  for (size_t b = threadIdx.x; b < kReductionBlocks; b += blockDim.x) sum += partials[b];
  return BlockAllReduce(sum, SumOp{}, temp, shared);
}

__global__ void MseFinishKernel(const double* partials, size_t count, double* loss) {
  __shared__ typename BlockReduce<double>::TempStorage temp;
  __shared__ double shared;
  const double sum = SumPartials(partials, temp, shared);
  if (threadIdx.x == 0) *loss = sum / static_cast<double>(count);
}

// Finite p: the block's sum of |g|^p in double.
__global__ void AbsPowPartialsKernel(const float* grads, size_t count, double p, double* partials) {
  __shared__ typename BlockReduce<double>::TempStorage temp;
  double sum = 0.0;
  for (size_t i = FirstIndex(); i < count; i += GridStride()) {
    sum += clip_math::AbsPow(grads[i], p);
  }
  const double block_sum = BlockReduce<double>(temp).Sum(sum);
  if (threadIdx.x == 0) partials[blockIdx.x] = block_sum;
}

// p = inf: the block's max |g| from 0, NaN propagated.
__global__ void AbsMaxPartialsKernel(const float* grads, size_t count, double* partials) {
  __shared__ typename BlockReduce<double>::TempStorage temp;
  double max = 0.0;
  for (size_t i = FirstIndex(); i < count; i += GridStride()) {
    max = clip_math::NaNMax(max, fabs(static_cast<double>(grads[i])));
  }
  const double block_max = BlockReduce<double>(temp).Reduce(max, NaNMaxOp{});
  if (threadIdx.x == 0) partials[blockIdx.x] = block_max;
}

// One block: tensor by tensor, in order, as the host's GradNormContribution.
__global__ void GradNormFinishKernel(const double* partials, size_t tensors, double p,
                                     double* out) {
  __shared__ typename BlockReduce<double>::TempStorage temp;
  __shared__ double shared;
  const bool inf = clip_math::IsInf(p);
  double local = 0.0;  // meaningful in thread 0
  for (size_t t = 0; t < tensors; ++t) {
    const double* tensor = partials + t * kReductionBlocks;
    if (inf) {
      double max = 0.0;
      for (size_t b = threadIdx.x; b < kReductionBlocks; b += blockDim.x) {
        max = clip_math::NaNMax(max, tensor[b]);
      }
      local = clip_math::NaNMax(local, BlockAllReduce(max, NaNMaxOp{}, temp, shared));
    } else {
      local += clip_math::TensorContribution(SumPartials(tensor, temp, shared), p);
    }
  }
  if (threadIdx.x == 0) *out = inf ? local : clip_math::RoundToFloat(local);
}

__global__ void ClipCoefficientKernel(const double* reduced, double p, double max_norm,
                                      float* coef) {
  const double total = clip_math::TotalNorm(*reduced, 0.0, p);
  *coef = clip_math::ClipCoefficient(max_norm, total);
}

__global__ void ScaleGradsKernel(float* grads, size_t count, const float* coef) {
  const float c = *coef;
  for (size_t i = FirstIndex(); i < count; i += GridStride()) grads[i] *= c;
}

}  // namespace

cudaError_t LaunchMseLoss(const float* out, const float* target, size_t count, float* grad,
                          double* partials, double* loss, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ClearStaleError();
  MsePartialsKernel<<<kReductionBlocks, kThreads, 0, stream>>>(out, target, count, grad, partials);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  MseFinishKernel<<<1, kThreads, 0, stream>>>(partials, count, loss);
  return cudaGetLastError();
}

cudaError_t LaunchGradNormPartials(const float* grads, size_t count, double norm_type,
                                   double* partials, cudaStream_t stream) {
  ClearStaleError();
  // Launched even for an empty tensor: its partials are then the identities.
  if (clip_math::IsInf(norm_type)) {
    AbsMaxPartialsKernel<<<kReductionBlocks, kThreads, 0, stream>>>(grads, count, partials);
  } else {
    AbsPowPartialsKernel<<<kReductionBlocks, kThreads, 0, stream>>>(grads, count, norm_type,
                                                                    partials);
  }
  return cudaGetLastError();
}

cudaError_t LaunchGradNormFinish(const double* partials, size_t tensors, double norm_type,
                                 double* out, cudaStream_t stream) {
  ClearStaleError();
  GradNormFinishKernel<<<1, kThreads, 0, stream>>>(partials, tensors, norm_type, out);
  return cudaGetLastError();
}

cudaError_t LaunchClipCoefficient(const double* reduced, double norm_type, double max_norm,
                                  float* coef, cudaStream_t stream) {
  ClearStaleError();
  ClipCoefficientKernel<<<1, 1, 0, stream>>>(reduced, norm_type, max_norm, coef);
  return cudaGetLastError();
}

cudaError_t LaunchScaleGrads(float* grads, size_t count, const float* coef, cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  ClearStaleError();
  ScaleGradsKernel<<<BlocksFor(count), kThreads, 0, stream>>>(grads, count, coef);
  return cudaGetLastError();
}

}  // namespace flatshard::cuda
