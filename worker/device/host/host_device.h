// The CPU device: host memory from the block cache, kernels as host loops and
// OpenBLAS (host_kernels.h). Its compute stream runs every operation inline on
// the calling thread, as the CPU runtime always has (no hand-off for the many
// small kernels); any other stream runs on a thread of its own, which is what
// lets the communication stream's Gloo collectives overlap compute. An event
// recorded on the inline stream is complete at once; waiting on the thread
// stream's event from the inline stream blocks the caller until the thread got
// there, exactly the ordering a GPU stream wait gives.
#ifndef FLATSHARD_WORKER_DEVICE_HOST_HOST_DEVICE_H_
#define FLATSHARD_WORKER_DEVICE_HOST_HOST_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "worker/device/device.h"

namespace flatshard {

class HostDevice : public Device {
 public:
  HostDevice() = default;

  DeviceKind kind() const override { return DeviceKind::kCpu; }
  std::string name() const override { return "cpu"; }
  bool memory_is_host_memory() const override { return true; }
  absl::Status MakeCurrent() override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(StreamRole role,
                                                       absl::string_view name) override;
  DeviceMemoryStats MemoryStats() const override;

  // The host address behind a span of this device's memory: for code that is
  // host-only by nature (the single-process reference trainer, tests).
  template <typename T>
  static T* HostAddress(DeviceSpan<T> span) {
    return span.address();
  }

  // Whether [data, data + bytes) lies in pinned memory this device handed
  // out. A thread stream's copy to or from it is asynchronous, as a CUDA copy
  // to pinned memory is (the host reads it after an event); other host memory
  // is pageable, its copies complete before the call returns.
  bool IsPinned(const void* data, size_t bytes) const;

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes, Stream& stream) override;
  void FreeRaw(void* address, size_t bytes, Stream& stream) override;
  absl::StatusOr<std::byte*> AllocatePinnedRaw(size_t bytes) override;
  void FreePinnedRaw(std::byte* data, size_t bytes) override;
  // Pinned and device memory are both the process's block cache.
  void AdoptPinnedRaw(std::byte* data, size_t bytes) override;

 private:
  std::atomic<int64_t> in_use_{0};
  mutable std::mutex pinned_mu_;
  std::map<uintptr_t, size_t> pinned_;  // address -> bytes, of live pinned blocks
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_HOST_HOST_DEVICE_H_
