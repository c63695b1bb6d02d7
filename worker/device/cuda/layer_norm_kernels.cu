// LayerNorm over the last dimension: a block per row reduces the row's
// statistics in double with cub::BlockReduce (as the host does in double, in a
// different order), then every element goes through the shared element bodies.
// The weight and bias gradients are column sums (LaunchColumnSums), in the
// host's order.
#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/launch_config.cuh"
#include "worker/device/kernels/element_ops.h"

namespace flatshard::cuda {
namespace {

__global__ void LayerNormForwardKernel(const float* x, size_t rows, size_t dim, const float* weight,
                                       const float* bias, double eps, float* y, float* xhat,
                                       float* rstd) {
  __shared__ typename BlockReduce<double>::TempStorage temp;
  __shared__ double shared;
  const auto n = static_cast<double>(dim);
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* xr = x + r * dim;
    double sum = 0.0;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) sum += xr[i];
    const double mean = BlockAllReduce(sum, SumOp{}, temp, shared) / n;
    double squares = 0.0;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const double centered = xr[i] - mean;
      squares += centered * centered;
    }
    const double variance = BlockAllReduce(squares, SumOp{}, temp, shared) / n;  // biased
    const float row_rstd = kernels::LayerNormRstd(variance, eps);
    if (threadIdx.x == 0) rstd[r] = row_rstd;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) {
      kernels::LayerNormForwardElement(xr, mean, row_rstd, weight, bias, xhat + r * dim,
                                       y + r * dim, static_cast<int64_t>(i));
    }
  }
}

__global__ void LayerNormInputGradKernel(const float* dy, const float* xhat, const float* rstd,
                                         size_t rows, size_t dim, const float* weight, float* dx) {
  __shared__ typename BlockReduce<double>::TempStorage temp;
  __shared__ double shared;
  const auto n = static_cast<double>(dim);
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* dyr = dy + r * dim;
    const float* xr = xhat + r * dim;
    double dnorm_sum = 0.0, dnorm_xhat_sum = 0.0;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float dnorm = kernels::LayerNormDnorm(dyr, weight, static_cast<int64_t>(i));
      dnorm_sum += dnorm;
      // The product is a float, as in the host's loop, then summed in double.
      const float dnorm_xhat = dnorm * xr[i];
      dnorm_xhat_sum += dnorm_xhat;
    }
    const double mean_dnorm = BlockAllReduce(dnorm_sum, SumOp{}, temp, shared) / n;
    const double mean_dnorm_xhat = BlockAllReduce(dnorm_xhat_sum, SumOp{}, temp, shared) / n;
    float* dxr = dx + r * dim;
    for (size_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float dnorm = kernels::LayerNormDnorm(dyr, weight, static_cast<int64_t>(i));
      dxr[i] = kernels::LayerNormInputGrad(dnorm, xr[i], rstd[r], mean_dnorm, mean_dnorm_xhat);
    }
  }
}

}  // namespace

cudaError_t LaunchLayerNormForward(const float* x, size_t rows, size_t dim, const float* weight,
                                   const float* bias, double eps, float* y, float* xhat,
                                   float* rstd, cudaStream_t stream) {
  if (rows == 0 || dim == 0) return cudaSuccess;
  ClearStaleError();
  LayerNormForwardKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(x, rows, dim, weight, bias, eps,
                                                                   y, xhat, rstd);
  return cudaGetLastError();
}

cudaError_t LaunchLayerNormBackward(const float* dy, const float* xhat, const float* rstd,
                                    size_t rows, size_t dim, const float* weight, float* dx,
                                    float* weight_grad, float* bias_grad, float* partials,
                                    cudaStream_t stream) {
  if (rows == 0 || dim == 0) return cudaSuccess;
  ClearStaleError();
  LayerNormInputGradKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(dy, xhat, rstd, rows, dim,
                                                                     weight, dx);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  // One scratch for both sums: the stream runs them one after the other.
  if (weight_grad != nullptr) {
    const cudaError_t error = LaunchColumnSums(dy, xhat, rows, weight_grad, dim, partials, stream);
    if (error != cudaSuccess) return error;
  }
  if (bias_grad == nullptr) return cudaSuccess;
  return LaunchColumnSums(dy, nullptr, rows, bias_grad, dim, partials, stream);
}

}  // namespace flatshard::cuda
