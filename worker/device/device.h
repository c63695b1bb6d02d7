// The device a worker computes on, behind one interface (modelled on LevelDB's
// Env and PyTorch's c10 device/allocator split): its streams (stream.h), memory
// from a stream-ordered pool, and page-locked host memory for copies. Three
// implementations: `cpu` (worker/device/host/, OpenBLAS and the host block
// cache), `sim` (worker/device/sim/, the strict simulated device the tests use as
// evidence without a GPU) and `cuda` (worker/device/cuda/, cudaMallocAsync pools,
// cuBLAS, CUB and small kernels). docs/architecture.md §5 describes how the
// runtime uses them.
//
// Memory is stream-ordered, as with cudaMallocAsync: a buffer allocated on stream
// S may be used by S at once; another stream must first wait on an event S
// recorded after the allocation. A buffer is released on a stream that is ordered
// after every use of it on every stream (the record-stream rule: releasing on the
// allocation stream while another stream still reads it is a bug, and the sim
// device reports it).
#ifndef FLATSHARD_WORKER_DEVICE_DEVICE_H_
#define FLATSHARD_WORKER_DEVICE_DEVICE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/device_kind.h"
#include "worker/device/device_span.h"
#include "worker/device/memory_tracker.h"
#include "worker/device/stream.h"

namespace flatshard {

// What a stream is for. On the CPU device the compute stream runs inline on the
// calling thread (no hand-off cost for the many small kernels) and the others on
// a thread each; the other devices treat the roles alike.
enum class StreamRole { kCompute, kCommunication };

struct DeviceMemoryStats {
  int64_t pool_in_use_bytes = 0;    // allocated and not yet released
  int64_t pool_reserved_bytes = 0;  // held by the pool, in use or cached
  int64_t device_free_bytes = -1;   // the whole device (cudaMemGetInfo); -1 if unknown
  int64_t device_total_bytes = -1;
};

class Device;

// Device memory owned by one object (move-only). Released on its allocation
// stream by the destructor, or explicitly on the stream of its last use.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Release(); }
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  bool allocated() const { return device_ != nullptr; }
  size_t bytes() const { return bytes_; }
  Device* device() const { return device_; }

  // The whole buffer as elements of T (bytes() / sizeof(T) of them).
  template <typename T>
  DeviceSpan<T> span() const {
    return {static_cast<T*>(address_), bytes_ / sizeof(T)};
  }
  DeviceSpan<std::byte> byte_span() const { return span<std::byte>(); }

  // Returns the memory to the pool once `stream` reaches this point; `stream`
  // must be ordered after every use of the buffer. No-op when not allocated.
  void Release(Stream& stream);
  // The same on the stream the buffer was allocated on.
  void Release();

 private:
  friend class Device;
  DeviceBuffer(Device* device, void* address, size_t bytes, Stream* home, MemoryTracker* tracker,
               MemoryKind kind);

  Device* device_ = nullptr;
  void* address_ = nullptr;
  size_t bytes_ = 0;
  Stream* home_ = nullptr;
  MemoryTracker* tracker_ = nullptr;
  MemoryKind kind_ = MemoryKind::kActivations;
};

// Page-locked host memory for asynchronous copies (move-only). The host reads it
// only after the copy that wrote it is known complete (Stream/Event
// Synchronize) and writes it only when no copy still reads it: Read/Write say so
// through the device, and the sim device refuses an unsynchronized access.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer();
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  bool allocated() const { return device_ != nullptr; }
  size_t bytes() const { return bytes_; }

  // The memory as copy operands.
  std::span<std::byte> copy_target() { return {data_, bytes_}; }
  std::span<const std::byte> copy_source() const { return {data_, bytes_}; }

  // Host access, checked against the copies in flight.
  template <typename T>
  absl::StatusOr<std::span<const T>> Read() const;
  template <typename T>
  absl::StatusOr<std::span<T>> Write();

 private:
  friend class Device;
  PinnedBuffer(Device* device, std::byte* data, size_t bytes)
      : device_(device), data_(data), bytes_(bytes) {}

  Device* device_ = nullptr;
  std::byte* data_ = nullptr;
  size_t bytes_ = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  virtual DeviceKind kind() const = 0;
  // For Register and `flatshard workers`: "cpu", "sim", "NVIDIA H100 80GB HBM3".
  virtual std::string name() const = 0;

  // Makes this device current on the calling thread (cudaSetDevice). Every
  // thread that touches a device calls it first; a no-op off the GPU.
  virtual absl::Status MakeCurrent() = 0;

  virtual absl::StatusOr<std::unique_ptr<Stream>> CreateStream(StreamRole role,
                                                               absl::string_view name) = 0;

  // `bytes` of uninitialized memory usable on `stream`, charged to `kind` in
  // `tracker` (which may be null and must outlive the buffer) until released.
  // RESOURCE_EXHAUSTED when the device is out of memory.
  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, Stream& stream, MemoryKind kind,
                                        MemoryTracker* tracker);
  absl::StatusOr<PinnedBuffer> AllocatePinned(size_t bytes);
  // Whether the device's memory is ordinary host memory (the CPU device): then
  // a pinned block can become device memory as it is (AdoptPinned).
  virtual bool memory_is_host_memory() const { return false; }
  // Makes `target` (of this device, pinned's size, no longer in use on any
  // stream) hold the pinned block itself, releasing target's memory on its
  // stream: no copy (a checkpoint load's staged values become the shards).
  // FAILED_PRECONDITION unless memory_is_host_memory() or while a copy may
  // still use the block; INVALID_ARGUMENT for another device's memory or size.
  absl::Status AdoptPinned(PinnedBuffer pinned, DeviceBuffer& target);

  virtual DeviceMemoryStats MemoryStats() const = 0;

 protected:
  friend class DeviceBuffer;
  friend class PinnedBuffer;

  virtual absl::StatusOr<void*> AllocateRaw(size_t bytes, Stream& stream) = 0;
  virtual void FreeRaw(void* address, size_t bytes, Stream& stream) = 0;
  virtual absl::StatusOr<std::byte*> AllocatePinnedRaw(size_t bytes) = 0;
  virtual void FreePinnedRaw(std::byte* data, size_t bytes) = 0;
  // The bookkeeping of AdoptPinned: the live pinned block [data, data +
  // bytes) is device memory from now on, released by FreeRaw. Called only
  // where memory_is_host_memory().
  virtual void AdoptPinnedRaw(std::byte* data, size_t bytes) {
    (void)data;
    (void)bytes;
  }
  // Whether the host may read (or write) [data, data + bytes) of pinned memory
  // now; devices that cannot tell say yes.
  virtual absl::Status CheckHostAccess(const std::byte* data, size_t bytes, bool write) const {
    (void)data;
    (void)bytes;
    (void)write;
    return absl::OkStatus();
  }
};

template <typename T>
absl::StatusOr<std::span<const T>> PinnedBuffer::Read() const {
  if (absl::Status s = device_->CheckHostAccess(data_, bytes_, /*write=*/false); !s.ok()) return s;
  return std::span<const T>(reinterpret_cast<const T*>(data_), bytes_ / sizeof(T));
}

template <typename T>
absl::StatusOr<std::span<T>> PinnedBuffer::Write() {
  if (absl::Status s = device_->CheckHostAccess(data_, bytes_, /*write=*/true); !s.ok()) return s;
  return std::span<T>(reinterpret_cast<T*>(data_), bytes_ / sizeof(T));
}

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_DEVICE_H_
