#include "worker/device/device.h"

#include <utility>

#include "absl/strings/str_cat.h"

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

absl::Status Device::AdoptPinned(PinnedBuffer pinned, DeviceBuffer& target) {
  if (!memory_is_host_memory()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device ", name(),
                     " cannot adopt pinned memory: its memory is not the "
                     "host's; copy the values instead"));
  }
  if (pinned.device_ != this || target.device_ != this || pinned.bytes_ != target.bytes_) {
    return absl::InvalidArgumentError(absl::StrCat(
        "adopting ", pinned.bytes_, " bytes of pinned memory as a buffer of ", target.bytes_,
        " bytes", pinned.device_ != this || target.device_ != this ? " of another device" : ""));
  }
  if (absl::Status s = CheckHostAccess(pinned.data_, pinned.bytes_, /*write=*/true); !s.ok()) {
    return s;
  }
  AdoptPinnedRaw(pinned.data_, pinned.bytes_);
  target = DeviceBuffer(this, std::exchange(pinned.data_, nullptr), pinned.bytes_, target.home_,
                        target.tracker_, target.kind_);
  pinned.device_ = nullptr;  // the block is target's now
  return absl::OkStatus();
}

}  // namespace flatshard
