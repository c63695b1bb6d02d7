// One shard's optimizer state on the device: torch's step counter and the named
// state tensors (S floats each) as device buffers, created when core's step plan
// says torch would (core/optimizer.h PlanOptimizerStep), and updated by one
// fused kernel per step on the compute stream (core/optimizer_update.h's
// arithmetic). Saves see it as core's OptimizerState through host copies
// (ToHost), so the files and their rules are those of the host optimizer; a
// load replaces it from the host values it staged (FromHost).
#ifndef FLATSHARD_WORKER_RUNTIME_DEVICE_OPTIMIZER_STATE_H_
#define FLATSHARD_WORKER_RUNTIME_DEVICE_OPTIMIZER_STATE_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/optimizer.h"
#include "worker/device/device.h"
#include "worker/runtime/staged_floats.h"

namespace flatshard {

class DeviceOptimizerState {
 public:
  // State for a shard of `size` elements; buffers on `device`, work on `stream`.
  DeviceOptimizerState(OptimizerKind kind, size_t size, Device* device, Stream* stream,
                       MemoryTracker* memory);

  // One step of `settings` (of this state's kind) on the stream: params +=
  // update(grads, state). Nothing changes on error.
  absl::Status Step(const OptimizerSettings& settings, DeviceSpan<float> params,
                    DeviceSpan<const float> grads);

  double step() const { return step_; }
  // The tensors present, in torch's order.
  std::vector<std::string> StateNames() const;

  // A host copy (waits for the stream), and the reverse: replaces every tensor
  // and the step with staged `states` (names this kind keeps, `size` floats
  // each; StagedFloats::MoveInto) and `step`. The buffers a state lacks are
  // allocated before anything changes; the existing ones are reused.
  absl::StatusOr<std::unique_ptr<OptimizerState>> ToHost() const;
  absl::Status FromHost(std::map<std::string, StagedFloats> states, float step);
  // Tensor `name` copied once into pinned host memory by `stream`, ordered
  // after the state's last update; only enqueued (what a save snapshots, with
  // no second host copy). NotFound naming the tensors present.
  absl::StatusOr<PinnedBuffer> CopyToPinned(const std::string& name, Stream& stream) const;
  // Tensor `name` where it lives on the device; NotFound as CopyToPinned.
  absl::StatusOr<DeviceSpan<const float>> Tensor(const std::string& name) const;

 private:
  OptimizerKind kind_;
  size_t size_;
  Device* device_;
  Stream* stream_;
  MemoryTracker* memory_;
  float step_ = 0.0f;
  std::vector<std::string> order_;               // every tensor the kind may keep
  std::map<std::string, DeviceBuffer> tensors_;  // the present ones
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_DEVICE_OPTIMIZER_STATE_H_
