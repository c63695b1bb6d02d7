#include "absl/strings/str_cat.h"

#include "worker/device/cuda/cuda_status.h"
#include "worker/device/cuda/linear_kernels.h"

namespace flatshard::cuda {
namespace {

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLAS status ", static_cast<int>(status)));
}

// y[r, o] += b[o]
__global__ void AddBiasKernel(float* y, const float* b, int64_t rows, int64_t cols) {
  const int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < rows * cols) y[i] += b[i % cols];
}

// db[o] += sum_r dy[r, o]; one thread per column (bias vectors are short).
__global__ void BiasGradKernel(const float* dy, float* db, int64_t rows, int64_t cols) {
  const int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (o >= cols) return;
  float sum = 0.0f;
  for (int64_t r = 0; r < rows; ++r) sum += dy[r * cols + o];
  db[o] += sum;
}

}  // namespace

// cuBLAS is column-major: a row-major [R, C] matrix is a column-major [C, R] one,
// so each product below is written for the transposes.
absl::Status LinearForward(cublasHandle_t handle, cudaStream_t stream, const float* x,
                           const float* weight, const float* bias, float* y, int64_t rows,
                           int64_t in_features, int64_t out_features) {
  const absl::Status bound = CublasStatus(cublasSetStream(handle, stream), "cublasSetStream");
  if (!bound.ok()) return bound;
  const float one = 1.0f, zero = 0.0f;
  const int n = static_cast<int>(rows), k = static_cast<int>(in_features),
            m = static_cast<int>(out_features);
  // y^T[out, N] = W[out, in] * x^T[in, N]
  const absl::Status gemm = CublasStatus(
      cublasSgemm(handle, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &one, weight, k, x, k, &zero, y, m),
      "cublasSgemm(forward)");
  if (!gemm.ok() || bias == nullptr) return gemm;
  const int64_t total = rows * out_features;
  AddBiasKernel<<<static_cast<unsigned>((total + 255) / 256), 256, 0, stream>>>(y, bias, rows,
                                                                                out_features);
  return CudaStatus(cudaGetLastError(), "bias kernel launch");
}

absl::Status LinearBackward(cublasHandle_t handle, cudaStream_t stream, const float* x,
                            const float* weight, const float* dy, float* dx, float* weight_grad,
                            float* bias_grad, int64_t rows, int64_t in_features,
                            int64_t out_features) {
  const absl::Status bound = CublasStatus(cublasSetStream(handle, stream), "cublasSetStream");
  if (!bound.ok()) return bound;
  const float one = 1.0f, zero = 0.0f;
  const int n = static_cast<int>(rows), k = static_cast<int>(in_features),
            m = static_cast<int>(out_features);
  // dx^T[in, N] = W^T[in, out] * dy^T[out, N]
  const absl::Status input_grad = CublasStatus(
      cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_N, k, n, m, &one, weight, k, dy, m, &zero, dx, k),
      "cublasSgemm(dx)");
  if (!input_grad.ok()) return input_grad;
  // dW^T[in, out] += x^T[in, N] * dy[N, out]
  const absl::Status weight_grad_status =
      CublasStatus(cublasSgemm(handle, CUBLAS_OP_N, CUBLAS_OP_T, k, m, n, &one, x, k, dy, m, &one,
                               weight_grad, k),
                   "cublasSgemm(dW)");
  if (!weight_grad_status.ok() || bias_grad == nullptr) return weight_grad_status;
  BiasGradKernel<<<static_cast<unsigned>((out_features + 255) / 256), 256, 0, stream>>>(
      dy, bias_grad, rows, out_features);
  return CudaStatus(cudaGetLastError(), "bias grad kernel launch");
}

}  // namespace flatshard::cuda
