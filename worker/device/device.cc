#include "worker/device/device.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard {

DeviceBuffer::DeviceBuffer(Device* device, void* address, size_t bytes, Stream* home,
                           MemoryTracker* tracker, MemoryKind kind)
    : device_(device),
      address_(address),
      bytes_(bytes),
      home_(home),
      tracker_(tracker),
      kind_(kind) {
  if (tracker_ != nullptr) tracker_->Add(kind_, static_cast<int64_t>(bytes_));
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept { *this = std::move(other); }

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    device_ = std::exchange(other.device_, nullptr);
    address_ = std::exchange(other.address_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
    home_ = std::exchange(other.home_, nullptr);
    tracker_ = other.tracker_;
    kind_ = other.kind_;
  }
  return *this;
}

void DeviceBuffer::Release(Stream& stream) {
  if (device_ == nullptr) return;
  if (tracker_ != nullptr) tracker_->Sub(kind_, static_cast<int64_t>(bytes_));
  device_->FreeRaw(address_, bytes_, stream);
  device_ = nullptr;
  address_ = nullptr;
  bytes_ = 0;
  home_ = nullptr;
}

void DeviceBuffer::Release() {
  if (device_ != nullptr) Release(*home_);
}

PinnedBuffer::~PinnedBuffer() {
  if (device_ != nullptr) device_->FreePinnedRaw(data_, bytes_);
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept { *this = std::move(other); }

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (device_ != nullptr) device_->FreePinnedRaw(data_, bytes_);
    device_ = std::exchange(other.device_, nullptr);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

absl::StatusOr<DeviceBuffer> Device::Allocate(size_t bytes, Stream& stream, MemoryKind kind,
                                              MemoryTracker* tracker) {
  if (&stream.device() != this) {
    return absl::InvalidArgumentError(
        absl::StrCat("allocation on stream '", stream.name(), "' of another device"));
  }
  absl::StatusOr<void*> address = AllocateRaw(bytes, stream);
  if (!address.ok()) return address.status();
  return DeviceBuffer(this, *address, bytes, &stream, tracker, kind);
}

absl::StatusOr<PinnedBuffer> Device::AllocatePinned(size_t bytes) {
  absl::StatusOr<std::byte*> data = AllocatePinnedRaw(bytes);
  if (!data.ok()) return data.status();
  return PinnedBuffer(this, *data, bytes);
}

absl::StatusOr<DeviceBuffer> Device::FromPinned(PinnedBuffer pinned, Stream& stream,
                                                MemoryKind kind, MemoryTracker* tracker) {
  if (pinned.device_ != this || &stream.device() != this) {
    return absl::InvalidArgumentError(
        absl::StrCat("pinned memory or stream '", stream.name(), "' of another device"));
  }
  if (AdoptPinnedRaw(pinned.data_, pinned.bytes_)) {
    DeviceBuffer adopted(this, pinned.data_, pinned.bytes_, &stream, tracker, kind);
    pinned.device_ = nullptr;  // the block is the buffer's now
    return adopted;
  }
  ASSIGN_OR_RETURN(DeviceBuffer buffer, Allocate(pinned.bytes(), stream, kind, tracker));
  RETURN_IF_ERROR(stream.CopyToDevice(buffer.byte_span(), pinned.copy_source()));
  // From pinned memory the copy is asynchronous, and `pinned` goes on return.
  RETURN_IF_ERROR(stream.Synchronize());
  return buffer;
}

}  // namespace flatshard
