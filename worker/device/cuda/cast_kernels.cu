#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "absl/strings/str_cat.h"

#include "worker/device/cuda/cast_kernels.h"
#include "worker/device/cuda/cuda_status.h"

namespace flatshard::cuda {
namespace {

constexpr int kThreads = 256;

// __float2bfloat16_rn / __float2half_rn round to nearest even, like the host.
__global__ void FloatToBFloat16Kernel(const float* src, __nv_bfloat16* dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __float2bfloat16_rn(src[i]);
  }
}

__global__ void BFloat16ToFloatKernel(const __nv_bfloat16* src, float* dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __bfloat162float(src[i]);
  }
}

__global__ void FloatToHalfKernel(const float* src, __half* dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __float2half_rn(src[i]);
  }
}

__global__ void HalfToFloatKernel(const __half* src, float* dst, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    dst[i] = __half2float(src[i]);
  }
}

unsigned Blocks(size_t n) {
  const size_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 4096 ? (blocks == 0 ? 1 : blocks) : 4096);
}

}  // namespace

absl::Status CastOnDevice(DType src_dtype, const void* src, DType dst_dtype, void* dst,
                          size_t count, cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  if (src_dtype == dst_dtype) {
    return CudaStatus(
        cudaMemcpyAsync(dst, src, count * DTypeSize(src_dtype), cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync");
  }
  const unsigned blocks = Blocks(count);
  if (src_dtype == DType::kFloat32 && dst_dtype == DType::kBFloat16) {
    FloatToBFloat16Kernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(src),
                                                           static_cast<__nv_bfloat16*>(dst), count);
  } else if (src_dtype == DType::kBFloat16 && dst_dtype == DType::kFloat32) {
    BFloat16ToFloatKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __nv_bfloat16*>(src),
                                                           static_cast<float*>(dst), count);
  } else if (src_dtype == DType::kFloat32 && dst_dtype == DType::kFloat16) {
    FloatToHalfKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const float*>(src),
                                                       static_cast<__half*>(dst), count);
  } else if (src_dtype == DType::kFloat16 && dst_dtype == DType::kFloat32) {
    HalfToFloatKernel<<<blocks, kThreads, 0, stream>>>(static_cast<const __half*>(src),
                                                       static_cast<float*>(dst), count);
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        "CastOnDevice: no kernel for ", DTypeName(src_dtype), " -> ", DTypeName(dst_dtype)));
  }
  return CudaStatus(cudaGetLastError(), "cast kernel launch");
}

}  // namespace flatshard::cuda
