// A view of device memory: an address in one device's memory space and an element
// count. The address is only meaningful to that device's streams. Host code never
// dereferences it: on the CPU device it happens to be a host address, on the
// simulated device it is not a host address at all (a dereference faults), and on
// a GPU it is device memory. Layers, units and collectives pass DeviceSpans around
// and hand them to Stream operations (worker/device/stream.h), nothing else.
#ifndef FLATSHARD_WORKER_DEVICE_DEVICE_SPAN_H_
#define FLATSHARD_WORKER_DEVICE_DEVICE_SPAN_H_

#include <cassert>
#include <cstddef>
#include <type_traits>

namespace flatshard {

template <typename T>
class DeviceSpan {
 public:
  constexpr DeviceSpan() = default;
  // For DeviceBuffer and device implementations: `address` is in the device's space.
  constexpr DeviceSpan(T* address, size_t size) : address_(address), size_(size) {}
  // DeviceSpan<T> converts to DeviceSpan<const T>.
  template <typename U>
  requires std::is_convertible_v<U (*)[], T (*)[]>
  constexpr DeviceSpan(DeviceSpan<U> other)  // NOLINT(google-explicit-constructor)
      : address_(other.address()), size_(other.size()) {}

  constexpr T* address() const { return address_; }
  constexpr size_t size() const { return size_; }
  constexpr size_t size_bytes() const { return size_ * sizeof(T); }
  constexpr bool empty() const { return size_ == 0; }

  // Elements [offset, offset + count); the range must lie inside this span.
  constexpr DeviceSpan subspan(size_t offset, size_t count) const {
    assert(offset <= size_ && count <= size_ - offset);
    return DeviceSpan(address_ + offset, count);
  }
  constexpr DeviceSpan first(size_t count) const { return subspan(0, count); }

 private:
  T* address_ = nullptr;
  size_t size_ = 0;
};

// The same memory as bytes.
template <typename T>
DeviceSpan<const std::byte> AsBytes(DeviceSpan<T> span) {
  return {reinterpret_cast<const std::byte*>(span.address()), span.size_bytes()};
}
template <typename T>
requires(!std::is_const_v<T>) DeviceSpan<std::byte> AsWritableBytes(DeviceSpan<T> span) {
  return {reinterpret_cast<std::byte*>(span.address()), span.size_bytes()};
}

// Bytes viewed as elements of T (whole elements only).
template <typename T>
DeviceSpan<T> AsTyped(DeviceSpan<std::byte> bytes) {
  return {reinterpret_cast<T*>(bytes.address()), bytes.size() / sizeof(T)};
}
template <typename T>
DeviceSpan<const T> AsTyped(DeviceSpan<const std::byte> bytes) {
  return {reinterpret_cast<const T*>(bytes.address()), bytes.size() / sizeof(T)};
}

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_DEVICE_SPAN_H_
