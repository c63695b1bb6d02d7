// FsdpRuntime's step: the program's markers and ops around the model's forward
// and backward, issued onto the compute and communication streams with the
// event waits docs/architecture.md §5 describes, and manual control commands.
#include <algorithm>

#include "absl/strings/str_cat.h"

#include "core/clip_grad_norm.h"
#include "core/clip_grad_norm_math.h"
#include "core/status_macros.h"
#include "worker/runtime/fsdp_runtime.h"

namespace flatshard {

absl::StatusOr<StepStats> FsdpRuntime::RunStep(const StepProgram& program,
                                               const compute::Batch& batch) {
  RETURN_IF_ERROR(device_->MakeCurrent());
  program_ = &program;
  cursor_ = 0;
  stats_ = StepStats{};
  waits_.clear();
  optim_start_ = optim_end_ = nullptr;
  clip_norm_type_ = 0.0;
  absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(step_start_, compute_->Record());
    if (grads_stale_) {
      for (auto& unit : units_) unit->ClearGradShard();
      grads_stale_ = false;
    }
    // FSDP's root pre-forward wait: the communication stream gathers shards the
    // optimizer (or a load) updated on the compute stream.
    RETURN_IF_ERROR(CommWaitsForCompute());
    // NO_SHARD keeps whole parameters: build their compute views up front.
    if (!IsSharded(strategy_)) {
      for (size_t u = 0; u < units_.size(); ++u) {
        units_[u]->Free();
        RETURN_IF_ERROR(units_[u]->Gather());
        RETURN_IF_ERROR(TimedWait(units_[u]->gathered()));
      }
    }
    RETURN_IF_ERROR(model_->Forward(batch, *this, *this));
    RETURN_IF_ERROR(model_->Backward(*this, *this));
    RETURN_IF_ERROR(RunUntilMarker());
    if (cursor_ != program.size()) {
      return absl::InternalError(absl::StrCat(
          "step program has ", program.size() - cursor_,
          " commands left after the model finished, next: ", DescribeCommand(program[cursor_])));
    }
    RETURN_IF_ERROR(WaitForComm());
    ASSIGN_OR_RETURN(step_end_, compute_->Record());
    RETURN_IF_ERROR(SynchronizeStreams());
    ASSIGN_OR_RETURN(stats_.loss, model_->ReadLoss());
    if (clip_norm_type_ > 0.0) {
      ASSIGN_OR_RETURN(std::span<const double> reduced, std::as_const(norm_host_).Read<double>());
      stats_.grad_norm = clip_math::TotalNorm(reduced[0], 0.0, clip_norm_type_);
    }
    return CollectTimings();
  }();
  program_ = nullptr;
  groups_.FlushObservations();
  if (!status.ok()) return status;
  if (options_.observer != nullptr) {
    options_.observer->OnStep(
        stats_, stats_.compute_seconds + stats_.exposed_comm_seconds + stats_.optimizer_seconds);
  }
  return stats_;
}

absl::Status FsdpRuntime::CollectTimings() {
  ASSIGN_OR_RETURN(const double total, step_end_->SecondsSince(*step_start_));
  for (const auto& [before, after] : waits_) {
    ASSIGN_OR_RETURN(const double waited, after->SecondsSince(*before));
    stats_.exposed_comm_seconds += waited;
  }
  if (optim_start_ != nullptr && optim_end_ != nullptr) {
    ASSIGN_OR_RETURN(stats_.optimizer_seconds, optim_end_->SecondsSince(*optim_start_));
  }
  stats_.compute_seconds =
      std::max(0.0, total - stats_.exposed_comm_seconds - stats_.optimizer_seconds);
  return absl::OkStatus();
}

absl::Status FsdpRuntime::TimedWait(const Event& event) {
  ASSIGN_OR_RETURN(std::shared_ptr<Event> before, compute_->Record());
  RETURN_IF_ERROR(compute_->Wait(event));
  ASSIGN_OR_RETURN(std::shared_ptr<Event> after, compute_->Record());
  if (program_ != nullptr) waits_.emplace_back(std::move(before), std::move(after));
  return absl::OkStatus();
}

absl::Status FsdpRuntime::WaitForComm() {
  ASSIGN_OR_RETURN(std::shared_ptr<Event> comm_done, comm_->Record());
  return TimedWait(*comm_done);
}

absl::Status FsdpRuntime::CommWaitsForCompute() {
  ASSIGN_OR_RETURN(std::shared_ptr<Event> compute_done, compute_->Record());
  return comm_->Wait(*compute_done);
}

absl::Status FsdpRuntime::OnMarker(bool backward, bool done, int module_index) {
  NoteProgress();
  if (!unit_of_module_.contains(module_index)) return absl::OkStatus();
  if (program_ == nullptr) {
    return absl::FailedPreconditionError("model ran outside a step program");
  }
  const auto describe = [&] {
    return absl::StrCat(backward ? "Backward" : "Forward", done ? "Done(" : "(", module_index, ")");
  };
  if (cursor_ >= program_->size()) {
    return absl::InternalError(
        absl::StrCat("the model reached ", describe(), " but the step program has ended"));
  }
  const StepCommand& next = (*program_)[cursor_];
  const StepCommand::Op want = backward ? StepCommand::Op::kBackward : StepCommand::Op::kForward;
  if (next.op != want || next.module != module_index || next.done != done) {
    return absl::InternalError(absl::StrCat(
        "the model reached ", describe(), " but the step program expects ", DescribeCommand(next)));
  }
  ++cursor_;
  return RunUntilMarker();
}

absl::Status FsdpRuntime::RunUntilMarker() {
  while (cursor_ < program_->size()) {
    const StepCommand& command = (*program_)[cursor_];
    if (command.op == StepCommand::Op::kForward || command.op == StepCommand::Op::kBackward) {
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(Execute(command));
    ++cursor_;
  }
  return absl::OkStatus();
}

absl::Status FsdpRuntime::BeforeForward(int m) { return OnMarker(false, false, m); }
absl::Status FsdpRuntime::AfterForward(int m) { return OnMarker(false, true, m); }
absl::Status FsdpRuntime::BeforeBackward(int m) {
  RETURN_IF_ERROR(OnMarker(true, false, m));
  // prepare_gradient_for_backward: the unit's unsharded gradient exists before
  // any of its parameters receive one.
  auto it = unit_of_module_.find(m);
  if (it != unit_of_module_.end()) {
    RETURN_IF_ERROR(units_[static_cast<size_t>(it->second)]->EnsureGrad().status());
  }
  return absl::OkStatus();
}
absl::Status FsdpRuntime::AfterBackward(int m) { return OnMarker(true, true, m); }

absl::Status FsdpRuntime::CheckUnit(int unit) const {
  if (unit < 0 || static_cast<size_t>(unit) >= units_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("unit ", unit, " does not exist (the job has ", units_.size(), " units)"));
  }
  return absl::OkStatus();
}

absl::Status FsdpRuntime::Execute(const StepCommand& command) {
  NoteProgress();
  switch (command.op) {
    case StepCommand::Op::kUnshard:
      return Unshard(command.unit, command.prefetch);
    case StepCommand::Op::kReshard:
      return Reshard(command.unit);
    case StepCommand::Op::kReduceGrad:
      return ReduceGrad(command.unit);
    case StepCommand::Op::kClipGradNorm:
      return ClipGradNorm(command.max_norm, command.norm_type);
    case StepCommand::Op::kOptimStep:
      return OptimStep();
    case StepCommand::Op::kZeroGrad:
      // The reductions may still accumulate into the grad shards.
      RETURN_IF_ERROR(WaitForComm());
      for (auto& unit : units_) unit->ClearGradShard();
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("command ", DescribeCommand(command), " cannot run inside a step"));
  }
}

absl::Status FsdpRuntime::RunControl(const StepProgram& program) {
  if (program_ != nullptr) {
    return absl::FailedPreconditionError("control commands cannot run inside a step");
  }
  RETURN_IF_ERROR(device_->MakeCurrent());
  absl::Status status = [&]() -> absl::Status {
    RETURN_IF_ERROR(CommWaitsForCompute());
    for (const StepCommand& command : program) {
      switch (command.op) {
        case StepCommand::Op::kUnshard:
          RETURN_IF_ERROR(Unshard(command.unit, /*prefetch=*/false));
          break;
        case StepCommand::Op::kReshard:
          RETURN_IF_ERROR(Reshard(command.unit));
          break;
        case StepCommand::Op::kBarrier:
          RETURN_IF_ERROR(SynchronizeStreams());
          RETURN_IF_ERROR(groups_.host_world->Barrier());
          break;
        default:
          return absl::InvalidArgumentError(absl::StrCat("command ", DescribeCommand(command),
                                                         " cannot run as a control command"));
      }
    }
    return SynchronizeStreams();
  }();
  groups_.FlushObservations();
  return status;
}

int FsdpRuntime::LiveNonRootUnits() const {
  int live = 0;
  for (size_t u = 0; u < units_.size(); ++u) {
    if (states_[u] != UnitState::kSharded && !unit_specs_[u].is_root) ++live;
  }
  return live;
}

absl::Status FsdpRuntime::Unshard(int unit, bool prefetch) {
  RETURN_IF_ERROR(CheckUnit(unit));
  const auto u = static_cast<size_t>(unit);
  if (states_[u] == UnitState::kSharded) {
    // docs/fsdp-semantics.md §9.3: with limit_all_gathers at most two units
    // (besides the root, which stays unsharded through forward) are live. A
    // prefetch that would exceed the cap is dropped; the unit is gathered when
    // it is needed instead.
    if (prefetch && options_.sharding.limit_all_gathers && !unit_specs_[u].is_root &&
        LiveNonRootUnits() >= 2) {
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(units_[u]->Gather());
    states_[u] = UnitState::kGathering;
    if (options_.observer != nullptr) options_.observer->OnUnshard();
    peak_live_units_ = std::max(peak_live_units_, LiveNonRootUnits());
  }
  if (prefetch) return absl::OkStatus();
  return WaitGathered(unit);
}

absl::Status FsdpRuntime::WaitGathered(int unit) {
  const auto u = static_cast<size_t>(unit);
  if (states_[u] != UnitState::kGathering) return absl::OkStatus();
  if (options_.testing_dropped_wait != RuntimeOptions::DroppedWait::kGather) {
    RETURN_IF_ERROR(TimedWait(units_[u]->gathered()));
  }
  states_[u] = UnitState::kUnsharded;
  return absl::OkStatus();
}

absl::Status FsdpRuntime::Reshard(int unit) {
  RETURN_IF_ERROR(CheckUnit(unit));
  // The compute stream releases the gathered buffers: it must be ordered
  // after the gather that wrote them, even when nothing used them.
  RETURN_IF_ERROR(WaitGathered(unit));
  const auto u = static_cast<size_t>(unit);
  if (states_[u] == UnitState::kUnsharded && options_.observer != nullptr) {
    options_.observer->OnReshard();
  }
  units_[u]->Free();
  states_[u] = UnitState::kSharded;
  return absl::OkStatus();
}

absl::Status FsdpRuntime::ReduceGrad(int unit) {
  RETURN_IF_ERROR(CheckUnit(unit));
  FlatParamUnit& target = *units_[static_cast<size_t>(unit)];
  // A unit that got no gradient this step still takes part, with zeros, so the
  // ranks' collectives stay matched.
  RETURN_IF_ERROR(target.EnsureGrad().status());
  // The reduction reads what the backward wrote: the communication stream
  // waits for the compute stream's work so far.
  if (options_.testing_dropped_wait != RuntimeOptions::DroppedWait::kBackward) {
    RETURN_IF_ERROR(CommWaitsForCompute());
  }
  return target.ReduceGrad();
}

absl::Status FsdpRuntime::ClipGradNorm(double max_norm, double norm_type) {
  ClipGradNormOptions clip;
  clip.max_norm = max_norm;
  clip.norm_type = norm_type;
  RETURN_IF_ERROR(ValidateClipGradNormOptions(clip));
  // The grad shards are complete once the reductions are.
  RETURN_IF_ERROR(WaitForComm());
  std::vector<DeviceSpan<const float>> grads;
  std::vector<DeviceSpan<float>> scaled;
  for (auto& unit : units_) {
    if (!unit->has_grad_shard()) continue;
    grads.emplace_back(unit->grad_shard());
    scaled.push_back(unit->grad_shard());
  }
  // docs/fsdp-semantics.md §8: sharded grads' local p-th powers (or max) are
  // reduced over the shard group; NO_SHARD grads are replicated, so the local
  // norm is total. All on the device: nothing waits for the host.
  const DeviceSpan<double> norm = norm_.span<double>();
  RETURN_IF_ERROR(compute_->GradNormContribution(grads, norm_type, norm));
  if (IsSharded(strategy_)) {
    RETURN_IF_ERROR(CommWaitsForCompute());
    RETURN_IF_ERROR(
        groups_.shard_group()->AllReduce(*comm_, AsWritableBytes(norm), 1, DType::kFloat64,
                                         IsInfNorm(norm_type) ? ReduceOp::kMax : ReduceOp::kSum));
    RETURN_IF_ERROR(WaitForComm());
  }
  RETURN_IF_ERROR(compute_->ClipGrads(scaled, norm, norm_type, max_norm));
  RETURN_IF_ERROR(compute_->CopyToHost(norm_host_.copy_target(), AsBytes(norm)));
  clip_norm_type_ = norm_type;
  return absl::OkStatus();
}

absl::Status FsdpRuntime::OptimStep() {
  RETURN_IF_ERROR(WaitForComm());
  // A snapshot taken since the last update may still be copying this state.
  if (options_.testing_dropped_wait != RuntimeOptions::DroppedWait::kSnapshot) {
    RETURN_IF_ERROR(AwaitSnapshotCopies());
  }
  // _catch_all_reshard: a unit still unsharded here would serve stale values
  // after the update, so every gathered buffer goes before the shards change.
  if (IsSharded(strategy_)) {
    for (size_t u = 0; u < units_.size(); ++u) {
      if (states_[u] != UnitState::kSharded) RETURN_IF_ERROR(Reshard(static_cast<int>(u)));
    }
  }
  ASSIGN_OR_RETURN(optim_start_, compute_->Record());
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatParamUnit& unit = *units_[u];
    if (!unit.has_grad_shard()) continue;  // torch skips params whose grad is None
    RETURN_IF_ERROR(optim_states_[u]->Step(options_.optimizer, unit.shard(), unit.grad_shard()));
  }
  ASSIGN_OR_RETURN(optim_end_, compute_->Record());
  grads_stale_ = true;
  return absl::OkStatus();
}

}  // namespace flatshard
