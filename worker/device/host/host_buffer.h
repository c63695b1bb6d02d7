// Host memory for FSDP buffers: 64-byte aligned (cache lines, AVX-512 loads),
// accounted in a MemoryTracker for its lifetime. Movable, not copyable; Release()
// frees early (FSDP's _free_storage) and keeps the object.
//
// Released blocks go to a small process-wide cache keyed by size and are handed
// out again, like PyTorch's caching allocator: FSDP allocates and frees the same
// all-gather and gradient sizes every step, and fresh pages from the kernel cost
// a fault each (64 MiB is 16k faults, slower than moving the bytes over Gloo).
// The tracker counts buffers in use, not the cache.
#ifndef FLATSHARD_WORKER_DEVICE_HOST_HOST_BUFFER_H_
#define FLATSHARD_WORKER_DEVICE_HOST_HOST_BUFFER_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "core/dtype.h"
#include "worker/device/memory_tracker.h"

namespace flatshard {

class HostBuffer {
 public:
  HostBuffer() = default;
  enum class Init { kZero, kUninitialized };
  // Allocates `count` elements of `dtype`, charged to `kind` in `tracker` (which
  // may be null and must outlive the buffer). kUninitialized is for buffers the
  // caller overwrites whole (collective outputs, casts).
  HostBuffer(size_t count, DType dtype, MemoryTracker* tracker, MemoryKind kind,
             Init init = Init::kZero);
  ~HostBuffer();
  HostBuffer(HostBuffer&& other) noexcept;
  HostBuffer& operator=(HostBuffer&& other) noexcept;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;

  bool allocated() const { return data_ != nullptr; }
  void Release();

  std::byte* data() { return data_; }
  const std::byte* data() const { return data_; }
  size_t count() const { return count_; }
  size_t bytes() const { return count_ * DTypeSize(dtype_); }
  DType dtype() const { return dtype_; }
  std::span<std::byte> span() { return {data_, bytes()}; }
  std::span<const std::byte> span() const { return {data_, bytes()}; }
  // Typed view; T must match the dtype's size (float for float32).
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data_);
  }
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data_);
  }

 private:
  std::byte* data_ = nullptr;
  size_t count_ = 0;
  DType dtype_ = DType::kFloat32;
  MemoryTracker* tracker_ = nullptr;
  MemoryKind kind_ = MemoryKind::kShardedParams;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_HOST_HOST_BUFFER_H_
