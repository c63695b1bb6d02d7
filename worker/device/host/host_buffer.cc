#include "worker/device/host/host_buffer.h"

#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace flatshard {
namespace {

constexpr size_t kAlignment = 64;

}  // namespace

HostBuffer::HostBuffer(size_t count, DType dtype, MemoryTracker* tracker, MemoryKind kind)
    : count_(count), dtype_(dtype), tracker_(tracker), kind_(kind) {
  const size_t size = bytes();
  const size_t rounded = (size + kAlignment - 1) / kAlignment * kAlignment;
  data_ =
      static_cast<std::byte*>(std::aligned_alloc(kAlignment, rounded == 0 ? kAlignment : rounded));
  if (data_ == nullptr) throw std::bad_alloc();
  std::memset(data_, 0, size);
  if (tracker_ != nullptr) tracker_->Add(kind_, static_cast<int64_t>(size));
}

HostBuffer::~HostBuffer() { Release(); }

HostBuffer::HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    count_ = std::exchange(other.count_, 0);
    dtype_ = other.dtype_;
    tracker_ = other.tracker_;
    kind_ = other.kind_;
  }
  return *this;
}

void HostBuffer::Release() {
  if (data_ == nullptr) return;
  if (tracker_ != nullptr) tracker_->Sub(kind_, static_cast<int64_t>(bytes()));
  std::free(data_);
  data_ = nullptr;
  count_ = 0;
}

}  // namespace flatshard
