#include "worker/runtime/device_optimizer_state.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/status_macros.h"

namespace flatshard {

DeviceOptimizerState::DeviceOptimizerState(OptimizerKind kind, size_t size, Device* device,
                                           Stream* stream, MemoryTracker* memory)
    : kind_(kind), size_(size), device_(device), stream_(stream), memory_(memory) {
  // The names and their order are core's (a fresh host state lists them all
  // as settable).
  if (kind == OptimizerKind::kSgd) {
    order_ = {std::string(SgdState::kMomentumBuffer)};
  } else {
    order_ = {std::string(AdamState::kExpAvg), std::string(AdamState::kExpAvgSq),
              std::string(AdamState::kMaxExpAvgSq)};
  }
}

std::vector<std::string> DeviceOptimizerState::StateNames() const {
  std::vector<std::string> names;
  for (const std::string& name : order_) {
    if (tensors_.contains(name)) names.push_back(name);
  }
  return names;
}

absl::Status DeviceOptimizerState::Step(const OptimizerSettings& settings, DeviceSpan<float> params,
                                        DeviceSpan<const float> grads) {
  if (settings.kind != kind_ &&
      (settings.kind == OptimizerKind::kSgd || kind_ == OptimizerKind::kSgd)) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer step: a ", OptimizerKindName(kind_),
                                                   " state cannot take a ",
                                                   OptimizerKindName(settings.kind), " step"));
  }
  if (params.size() != size_ || grads.size() != size_) {
    return absl::InvalidArgumentError(absl::StrCat("optimizer step: params (", params.size(),
                                                   ") and grads (", grads.size(),
                                                   ") must hold the shard's ", size_, " elements"));
  }
  ASSIGN_OR_RETURN(
      OptimizerStepPlan plan,
      PlanOptimizerStep(
          settings, [&](absl::string_view name) { return tensors_.contains(std::string(name)); },
          step_));
  std::map<std::string, DeviceBuffer> created;
  for (const std::string& name : plan.create) {
    ASSIGN_OR_RETURN(DeviceBuffer buffer, device_->Allocate(size_ * sizeof(float), *stream_,
                                                            MemoryKind::kOptimizerState, memory_));
    RETURN_IF_ERROR(stream_->Zero(buffer.byte_span()));  // zeros_like
    created.emplace(name, std::move(buffer));
  }
  auto tensor = [&](const std::string& name) {
    auto it = created.find(name);
    return (it != created.end() ? it->second : tensors_.at(name)).span<float>();
  };
  if (kind_ == OptimizerKind::kSgd) {
    RETURN_IF_ERROR(stream_->SgdStep(plan.sgd, params, grads,
                                     plan.use.empty() ? DeviceSpan<float>() : tensor(plan.use[0])));
  } else {
    RETURN_IF_ERROR(
        stream_->AdamStep(plan.adam, params, grads, tensor(plan.use[0]), tensor(plan.use[1]),
                          plan.adam.amsgrad ? tensor(plan.use[2]) : DeviceSpan<float>()));
  }
  for (auto& [name, buffer] : created) tensors_[name] = std::move(buffer);
  step_ = plan.step_after;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OptimizerState>> DeviceOptimizerState::ToHost() const {
  std::unique_ptr<OptimizerState> state = MakeOptimizerState(kind_, size_);
  for (const std::string& name : StateNames()) {
    ASSIGN_OR_RETURN(PinnedBuffer staging, device_->AllocatePinned(size_ * sizeof(float)));
    RETURN_IF_ERROR(stream_->CopyToHost(staging.copy_target(), tensors_.at(name).byte_span()));
    RETURN_IF_ERROR(stream_->Synchronize());
    ASSIGN_OR_RETURN(std::span<const float> values, std::as_const(staging).Read<float>());
    RETURN_IF_ERROR(state->SetState(name, values.first(size_)));
  }
  state->set_step(step_);
  return state;
}

absl::StatusOr<DeviceSpan<const float>> DeviceOptimizerState::Tensor(
    const std::string& name) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(absl::StrCat("no optimizer state '", name,
                                            "'; present: ", absl::StrJoin(StateNames(), ", ")));
  }
  return it->second.span<const float>();
}

absl::StatusOr<PinnedBuffer> DeviceOptimizerState::CopyToPinned(const std::string& name,
                                                                Stream& stream) const {
  ASSIGN_OR_RETURN(DeviceSpan<const float> tensor, Tensor(name));
  ASSIGN_OR_RETURN(PinnedBuffer pinned, device_->AllocatePinned(size_ * sizeof(float)));
  RETURN_IF_ERROR(stream.CopyToHost(pinned.copy_target(), AsBytes(tensor)));
  return pinned;
}

absl::Status DeviceOptimizerState::FromHost(std::map<std::string, StagedFloats> states,
                                            float step) {
  for (const auto& [name, values] : states) {
    if (std::find(order_.begin(), order_.end(), name) == order_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer state '", name, "' is not kept by ", OptimizerKindName(kind_)));
    }
    if (values.values().size() != size_) {
      return absl::InvalidArgumentError(absl::StrCat("optimizer state '", name, "' of ",
                                                     values.values().size(),
                                                     " elements for a shard of ", size_));
    }
  }
  // Every buffer first: running out of device memory changes nothing.
  std::map<std::string, DeviceBuffer> tensors;
  for (const auto& [name, values] : states) {
    if (tensors_.contains(name)) continue;
    ASSIGN_OR_RETURN(DeviceBuffer buffer, device_->Allocate(size_ * sizeof(float), *stream_,
                                                            MemoryKind::kOptimizerState, memory_));
    tensors.emplace(name, std::move(buffer));
  }
  for (auto& [name, buffer] : tensors_) {
    if (states.contains(name)) tensors.emplace(name, std::move(buffer));
  }
  tensors_ = std::move(tensors);  // a state the checkpoint lacks goes
  step_ = step;
  while (!states.empty()) {
    auto state = states.extract(states.begin());
    RETURN_IF_ERROR(std::move(state.mapped()).MoveInto(tensors_.at(state.key()), *stream_));
  }
  return absl::OkStatus();
}

}  // namespace flatshard
