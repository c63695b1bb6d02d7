// The `cuda` device (worker/device/device.h): one GPU, its streams
// (cuda_stream.h: cudaStream_t, the kernels of cuda_kernels.h, cuBLAS), memory
// from the device's default stream-ordered pool (cudaMallocAsync/cudaFreeAsync)
// and pinned host memory for asynchronous copies (docs/architecture.md §5).
//
// Memory: the pool's release threshold is raised to UINT64_MAX so memory freed
// by FSDP's reshard stays cached for the next unshard instead of going back to
// the driver at every synchronization, which is what PyTorch's caching
// allocator does for the same reason. Pinned buffers are kept in a small free
// list per size, since FSDP's staging reuses the same few sizes every step and
// cudaMallocHost/cudaFreeHost are slow (cudaFreeHost also synchronizes the
// device).
//
// Threads: every thread that issues work calls MakeCurrent first (the Device
// contract); creation and destruction of streams, events and pinned memory
// switch to this device themselves, so they work from any thread.
#ifndef FLATSHARD_WORKER_DEVICE_CUDA_CUDA_DEVICE_H_
#define FLATSHARD_WORKER_DEVICE_CUDA_CUDA_DEVICE_H_

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "worker/device/device.h"

namespace flatshard::cuda {

// Makes `ordinal` the calling thread's current device for its lifetime and
// restores the previous one (only switching when they differ).
class ScopedDevice {
 public:
  explicit ScopedDevice(int ordinal);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  // The error of the switch, if it failed.
  absl::Status status() const { return status_; }

 private:
  int previous_ = -1;
  absl::Status status_;
};

class CudaDevice final : public Device {
 public:
  // FAILED_PRECONDITION when no CUDA device is visible (no driver, no GPU, or
  // CUDA_VISIBLE_DEVICES hides them); INVALID_ARGUMENT for an ordinal outside
  // the visible devices.
  static absl::StatusOr<std::unique_ptr<CudaDevice>> Create(int ordinal);
  ~CudaDevice() override;

  DeviceKind kind() const override { return DeviceKind::kCuda; }
  std::string name() const override { return name_; }  // e.g. "NVIDIA H100 80GB HBM3"
  absl::Status MakeCurrent() override;
  // Non-blocking streams; the communication role gets the device's greatest
  // priority so collectives are not starved by compute kernels (FSDP gives its
  // unshard and reduction streams high priority too, docs/fsdp-semantics.md §2.6).
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(StreamRole role,
                                                       absl::string_view name) override;
  DeviceMemoryStats MemoryStats() const override;

  int ordinal() const { return ordinal_; }

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes, Stream& stream) override;
  void FreeRaw(void* address, size_t bytes, Stream& stream) override;
  absl::StatusOr<std::byte*> AllocatePinnedRaw(size_t bytes) override;
  void FreePinnedRaw(std::byte* data, size_t bytes) override;

 private:
  CudaDevice(int ordinal, std::string name, cudaMemPool_t pool)
      : ordinal_(ordinal), name_(std::move(name)), pool_(pool) {}

  const int ordinal_;
  const std::string name_;
  const cudaMemPool_t pool_;

  std::mutex pinned_mu_;
  // Freed pinned blocks by size, reused by the next request of that size.
  std::unordered_map<size_t, std::vector<std::byte*>> pinned_free_;
};

}  // namespace flatshard::cuda

#endif  // FLATSHARD_WORKER_DEVICE_CUDA_CUDA_DEVICE_H_
