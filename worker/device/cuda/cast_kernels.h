// fp32 <-> bf16/fp16 casts on a CUDA stream, for the low-precision all-gather
// shard and reduce-dtype gradients. Bit-exact with core/dtype.h's host
// conversions (round to nearest even), which the tests compare against.
#ifndef FLATSHARD_WORKER_DEVICE_CUDA_CAST_KERNELS_H_
#define FLATSHARD_WORKER_DEVICE_CUDA_CAST_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"

#include "core/dtype.h"

namespace flatshard::cuda {

// Converts `count` elements of device memory `src` (src_dtype) into `dst`
// (dst_dtype) on `stream`, asynchronously. Supported pairs: float32 <-> bfloat16,
// float32 <-> float16, and identical dtypes (a copy). INVALID_ARGUMENT otherwise.
absl::Status CastOnDevice(DType src_dtype, const void* src, DType dst_dtype, void* dst,
                          size_t count, cudaStream_t stream);

}  // namespace flatshard::cuda

#endif  // FLATSHARD_WORKER_DEVICE_CUDA_CAST_KERNELS_H_
