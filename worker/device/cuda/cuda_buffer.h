// CUDA memory for FSDP buffers, with the same accounting as HostBuffer:
// DeviceBuffer (cudaMalloc) for shards, all-gather buffers and gradients on the
// GPU, PinnedHostBuffer (cudaMallocHost) for CPU-offloaded master shards, which
// FSDP pins so the H2D copy before an all-gather is asynchronous.
#ifndef FLATSHARD_WORKER_DEVICE_CUDA_CUDA_BUFFER_H_
#define FLATSHARD_WORKER_DEVICE_CUDA_CUDA_BUFFER_H_

#include <cstddef>

#include "absl/status/statusor.h"

#include "core/dtype.h"
#include "worker/device/memory_tracker.h"

namespace flatshard::cuda {

class CudaBuffer {
 public:
  enum class Where { kDevice, kPinnedHost };

  // Zero-filled. FAILED_PRECONDITION without a device, RESOURCE_EXHAUSTED when
  // the allocation fails.
  static absl::StatusOr<CudaBuffer> Allocate(Where where, size_t count, DType dtype,
                                             MemoryTracker* tracker, MemoryKind kind);
  CudaBuffer() = default;
  ~CudaBuffer();
  CudaBuffer(CudaBuffer&& other) noexcept;
  CudaBuffer& operator=(CudaBuffer&& other) noexcept;
  CudaBuffer(const CudaBuffer&) = delete;
  CudaBuffer& operator=(const CudaBuffer&) = delete;

  void Release();
  void* data() { return data_; }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  Where where() const { return where_; }

 private:
  void* data_ = nullptr;
  size_t count_ = 0;
  DType dtype_ = DType::kFloat32;
  Where where_ = Where::kDevice;
  MemoryTracker* tracker_ = nullptr;
  MemoryKind kind_ = MemoryKind::kShardedParams;
};

}  // namespace flatshard::cuda

#endif  // FLATSHARD_WORKER_DEVICE_CUDA_CUDA_BUFFER_H_
