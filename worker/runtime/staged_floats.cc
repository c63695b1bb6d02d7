#include "worker/runtime/staged_floats.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard {

absl::StatusOr<StagedFloats> StagedFloats::Allocate(Device& device, size_t count) {
  StagedFloats staged;
  staged.device_ = &device;
  if (device.memory_is_host_memory()) {
    ASSIGN_OR_RETURN(staged.pinned_, device.AllocatePinned(count * sizeof(float)));
    ASSIGN_OR_RETURN(std::span<float> values, staged.pinned_.Write<float>());
    staged.values_ = values.first(count);
    return staged;
  }
  staged.pageable_ = std::make_unique_for_overwrite<float[]>(count);
  staged.values_ = std::span<float>(staged.pageable_.get(), count);
  if (device.kind() == DeviceKind::kSim) {
    std::fill(staged.values_.begin(), staged.values_.end(),
              std::numeric_limits<float>::quiet_NaN());
  }
  return staged;
}

absl::Status StagedFloats::MoveInto(DeviceBuffer& target, Stream& stream) && {
  if (target.device() != device_ || target.bytes() != values_.size_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("staged values of ", values_.size_bytes(), " bytes for a buffer of ",
                     target.bytes(), target.device() != device_ ? " on another device" : ""));
  }
  if (pinned_.allocated()) return device_->AdoptPinned(std::move(pinned_), target);
  // Pageable memory: the copy is complete when the call returns (stream.h); on
  // a GPU the device side may still be in flight until the synchronize.
  RETURN_IF_ERROR(stream.CopyToDevice(target.byte_span(), std::as_bytes(values_)));
  return stream.Synchronize();
}

}  // namespace flatshard
