// The causal softmax of attention and softmax cross-entropy: a block per row
// reduces the row's max and sum with cub::BlockReduce (the host loops, in a
// different order), then every element goes through the shared element bodies.
// The cross-entropy total over rows is deterministic: per-row losses, then one
// block sums them in a fixed order.
#include <cmath>

#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/launch_config.cuh"
#include "worker/device/kernels/element_ops.h"

namespace flatshard::cuda {
namespace {

// std::max(a, b) as the host's softmax applies it.
struct StdMaxOp {
  __device__ float operator()(float a, float b) const { return a < b ? b : a; }
};

// `b > a ? b : a`, the host's cross-entropy max.
struct GreaterOp {
  __device__ float operator()(float a, float b) const { return b > a ? b : a; }
};

// Row r of the matrices is query t = r % seq, which sees keys t2 <= t.
__global__ void CausalSoftmaxForwardKernel(const float* scores, size_t rows, size_t seq,
                                           float scale, float* probs) {
  __shared__ typename BlockReduce<float>::TempStorage temp;
  __shared__ float shared;
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const size_t visible = r % seq + 1;
    const float* s = scores + r * seq;
    float* p = probs + r * seq;
    float max = -INFINITY;
    for (size_t t2 = threadIdx.x; t2 < visible; t2 += blockDim.x) {
      max = StdMaxOp{}(max, s[t2] * scale);
    }
    max = BlockAllReduce(max, StdMaxOp{}, temp, shared);
    float sum = 0.0f;
    for (size_t t2 = threadIdx.x; t2 < visible; t2 += blockDim.x) {
      p[t2] = expf(s[t2] * scale - max);
      sum += p[t2];
    }
    const float inv_sum = 1.0f / BlockAllReduce(sum, SumOp{}, temp, shared);
    // Each thread scales the entries it wrote itself.
    for (size_t t2 = threadIdx.x; t2 < visible; t2 += blockDim.x) p[t2] *= inv_sum;
    for (size_t t2 = visible + threadIdx.x; t2 < seq; t2 += blockDim.x) p[t2] = 0.0f;
  }
}

__global__ void CausalSoftmaxBackwardKernel(const float* probs, const float* dprobs, size_t rows,
                                            size_t seq, float scale, float* dscores) {
  __shared__ typename BlockReduce<float>::TempStorage temp;
  __shared__ float shared;
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const size_t visible = r % seq + 1;
    const float* p = probs + r * seq;
    const float* dp = dprobs + r * seq;
    float* ds = dscores + r * seq;
    float weighted = 0.0f;
    for (size_t t2 = threadIdx.x; t2 < visible; t2 += blockDim.x) {
      const float product = p[t2] * dp[t2];
      weighted += product;
    }
    weighted = BlockAllReduce(weighted, SumOp{}, temp, shared);
    for (size_t t2 = threadIdx.x; t2 < visible; t2 += blockDim.x) {
      ds[t2] = kernels::SoftmaxInputGrad(p[t2], dp[t2], weighted, scale);
    }
    for (size_t t2 = visible + threadIdx.x; t2 < seq; t2 += blockDim.x) ds[t2] = 0.0f;
  }
}

// Per row: log(sum_k exp(z[k] - max)) - (z[label] - max) into row_losses, and
// the gradient (softmax - onehot) / rows.
__global__ void CrossEntropyRowsKernel(const float* logits, size_t rows, size_t classes,
                                       const int32_t* labels, float* grad, double* row_losses) {
  __shared__ typename BlockReduce<float>::TempStorage float_temp;
  __shared__ typename BlockReduce<double>::TempStorage double_temp;
  __shared__ float shared_max;
  __shared__ double shared_sum;
  const double inv_rows = 1.0 / static_cast<double>(rows);
  for (size_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const float* z = logits + r * classes;
    float* g = grad + r * classes;
    const auto label = static_cast<size_t>(labels[r]);
    float max = z[0];
    for (size_t k = threadIdx.x; k < classes; k += blockDim.x) max = GreaterOp{}(max, z[k]);
    max = BlockAllReduce(max, GreaterOp{}, float_temp, shared_max);
    double sum = 0.0;
    for (size_t k = threadIdx.x; k < classes; k += blockDim.x) {
      sum += exp(static_cast<double>(z[k]) - max);
    }
    sum = BlockAllReduce(sum, SumOp{}, double_temp, shared_sum);
    if (threadIdx.x == 0) row_losses[r] = log(sum) - (static_cast<double>(z[label]) - max);
    for (size_t k = threadIdx.x; k < classes; k += blockDim.x) {
      g[k] = kernels::CrossEntropyGrad(kernels::ShiftedExp(z[k], max), sum, k == label, inv_rows);
    }
  }
}

// One block: loss[0] = (sum of row_losses) / rows, summed in a fixed order.
__global__ void CrossEntropyTotalKernel(const double* row_losses, size_t rows, double* loss) {
  __shared__ typename BlockReduce<double>::TempStorage temp;
  double sum = 0.0;
  for (size_t r = threadIdx.x; r < rows; r += blockDim.x) sum += row_losses[r];
  const double total = BlockReduce<double>(temp).Sum(sum);
  if (threadIdx.x == 0) *loss = total * (1.0 / static_cast<double>(rows));
}

}  // namespace

cudaError_t LaunchCausalSoftmaxForward(const float* scores, size_t matrices, size_t seq,
                                       float scale, float* probs, cudaStream_t stream) {
  const size_t rows = matrices * seq;
  if (rows == 0) return cudaSuccess;
  ClearStaleError();
  CausalSoftmaxForwardKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(scores, rows, seq, scale,
                                                                       probs);
  return cudaGetLastError();
}

cudaError_t LaunchCausalSoftmaxBackward(const float* probs, const float* dprobs, size_t matrices,
                                        size_t seq, float scale, float* dscores,
                                        cudaStream_t stream) {
  const size_t rows = matrices * seq;
  if (rows == 0) return cudaSuccess;
  ClearStaleError();
  CausalSoftmaxBackwardKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(probs, dprobs, rows, seq,
                                                                        scale, dscores);
  return cudaGetLastError();
}

cudaError_t LaunchCrossEntropyLoss(const float* logits, size_t rows, size_t classes,
                                   const int32_t* labels, float* grad, double* row_losses,
                                   double* loss, cudaStream_t stream) {
  if (rows == 0 || classes == 0) return cudaSuccess;
  ClearStaleError();
  CrossEntropyRowsKernel<<<RowBlocks(rows), kThreads, 0, stream>>>(logits, rows, classes, labels,
                                                                   grad, row_losses);
  if (const cudaError_t error = cudaGetLastError(); error != cudaSuccess) return error;
  CrossEntropyTotalKernel<<<1, kThreads, 0, stream>>>(row_losses, rows, loss);
  return cudaGetLastError();
}

}  // namespace flatshard::cuda
