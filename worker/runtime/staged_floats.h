// Host values a checkpoint load (or a peer-snapshot restore) stages for one
// device buffer, then moves into it once every rank staged.
//
// Where the device's memory is host memory (the CPU device) the values are
// staged in one of its pinned blocks, which the device then takes as the
// buffer itself: no copy at the apply, and the blocks come back through the
// block cache, already faulted in (fresh pages for a rank's 200 MB cost more
// in faults than reading them). Elsewhere (a GPU, the sim device) they are
// staged in pageable memory and copied in place into the existing buffer: the
// apply allocates nothing, so it cannot run out of device memory halfway, and
// a load does not page-lock the whole staged state.
//
// The memory is not zeroed: a stager writes every element. On the sim device it
// starts as NaN, so a test that reads back an element no stager wrote fails.
#ifndef FLATSHARD_WORKER_RUNTIME_STAGED_FLOATS_H_
#define FLATSHARD_WORKER_RUNTIME_STAGED_FLOATS_H_

#include <cstddef>
#include <memory>
#include <span>

#include "absl/status/statusor.h"

#include "worker/device/device.h"

namespace flatshard {

class StagedFloats {
 public:
  StagedFloats() = default;
  StagedFloats(StagedFloats&&) = default;
  StagedFloats& operator=(StagedFloats&&) = default;

  // `count` floats for a buffer of `device`, their values undefined.
  static absl::StatusOr<StagedFloats> Allocate(Device& device, size_t count);

  // The memory to stage into. Moving a StagedFloats keeps it where it is.
  std::span<float> values() const { return values_; }

  // Makes `target` (of the same device and size, no longer in use on any
  // stream) hold the values: the block itself where the device adopts pinned
  // blocks (target's memory released), else a copy on `stream`, complete on
  // return.
  absl::Status MoveInto(DeviceBuffer& target, Stream& stream) &&;

 private:
  Device* device_ = nullptr;
  PinnedBuffer pinned_;                // where the device adopts pinned blocks
  std::unique_ptr<float[]> pageable_;  // elsewhere
  std::span<float> values_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_STAGED_FLOATS_H_
