// Linear layer forward and backward on the GPU through cuBLAS, with the same
// shapes and accumulation contract as worker/compute's CPU Linear:
//   forward   y[N, out] = x[N, in] W[out, in]^T + b[out]
//   backward  dx[N, in] = dy W;  dW += dy^T x;  db += sum_rows dy
// All pointers are device memory, row-major; work is queued on `stream`.
#ifndef FLATSHARD_WORKER_DEVICE_CUDA_LINEAR_KERNELS_H_
#define FLATSHARD_WORKER_DEVICE_CUDA_LINEAR_KERNELS_H_

#include <cstdint>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"

namespace flatshard::cuda {

absl::Status LinearForward(cublasHandle_t handle, cudaStream_t stream, const float* x,
                           const float* weight, const float* bias, float* y, int64_t rows,
                           int64_t in_features, int64_t out_features);

// `bias_grad` may be null (no bias). Weight and bias grads accumulate.
absl::Status LinearBackward(cublasHandle_t handle, cudaStream_t stream, const float* x,
                            const float* weight, const float* dy, float* dx, float* weight_grad,
                            float* bias_grad, int64_t rows, int64_t in_features,
                            int64_t out_features);

}  // namespace flatshard::cuda

#endif  // FLATSHARD_WORKER_DEVICE_CUDA_LINEAR_KERNELS_H_
