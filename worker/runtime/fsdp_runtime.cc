#include "worker/runtime/fsdp_runtime.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "absl/strings/str_cat.h"

#include "core/clip_grad_norm.h"
#include "core/flat_buffer.h"
#include "core/status_macros.h"
#include "core/unit_layout.h"
#include "worker/comm/observed_communicator.h"
#include "worker/compute/param_init.h"

namespace flatshard {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

FsdpRuntime::FsdpRuntime(const ModelSpec& spec, ModelIndex index, RuntimeOptions options, int rank,
                         int world_size)
    : spec_(spec),
      index_(std::move(index)),
      options_(std::move(options)),
      rank_(rank),
      world_size_(world_size),
      strategy_(EffectiveStrategy(options_.sharding.strategy, world_size)) {}

FsdpRuntime::~FsdpRuntime() {
  if (lane_ != nullptr) lane_->Drain().IgnoreError();
}

absl::StatusOr<std::unique_ptr<FsdpRuntime>> FsdpRuntime::Create(const ModelSpec& spec,
                                                                 const WrapPolicy& policy,
                                                                 const RuntimeOptions& options,
                                                                 int rank, int world_size,
                                                                 std::shared_ptr<Store> store) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside a world of size ", world_size));
  }
  ASSIGN_OR_RETURN(ModelIndex index, IndexModel(spec));
  std::unique_ptr<FsdpRuntime> runtime(
      new FsdpRuntime(spec, std::move(index), options, rank, world_size));
  RETURN_IF_ERROR(runtime->Build(policy, std::move(store)));
  return runtime;
}

absl::Status FsdpRuntime::Build(const WrapPolicy& policy, std::shared_ptr<Store> store) {
  const ShardingSettings& sharding = options_.sharding;
  ASSIGN_OR_RETURN(
      ranks_, ComputeRankLayout(sharding.strategy, world_size_, sharding.hybrid_shard_group_size));
  ASSIGN_OR_RETURN(unit_specs_, ComputeUnits(index_, policy));
  ASSIGN_OR_RETURN(model_, compute::Model::Create(spec_, index_, options_.loss));
  RETURN_IF_ERROR(ValidateOptimizerSettings(options_.optimizer));

  // Communicators: the world, then (hybrid) this rank's shard and replicate
  // groups, created in the same order on every rank.
  // Each is observed under the group it stands for (metrics' `group` label).
  RuntimeObserver* observer = options_.observer;
  auto observed = [observer](std::unique_ptr<Communicator> comm, absl::string_view group) {
    return Observe(std::move(comm), observer == nullptr ? nullptr : observer->Collectives(group));
  };
  ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> world,
                   GlooCommunicator::Create(std::move(store), rank_, world_size_, options_.gloo));
  world_comm_ = observed(std::move(world), "world");
  const bool hybrid = IsHybrid(strategy_);
  if (hybrid) {
    ASSIGN_OR_RETURN(
        std::unique_ptr<Communicator> shard,
        world_comm_->CreateSubgroup(ranks_.ShardGroup(rank_),
                                    absl::StrCat("shard", ranks_.ReplicaIndex(rank_))));
    shard_comm_ = observed(std::move(shard), "shard");
    if (ranks_.replicas > 1) {
      ASSIGN_OR_RETURN(
          std::unique_ptr<Communicator> replicate,
          world_comm_->CreateSubgroup(ranks_.ReplicateGroup(rank_),
                                      absl::StrCat("replicate", ranks_.ShardRank(rank_))));
      replicate_comm_ = observed(std::move(replicate), "replicate");
    }
  }
  Communicator* shard_comm = hybrid ? shard_comm_.get() : world_comm_.get();
  // Async checkpoint saves gather their snapshot over their own context, so a
  // background save never interleaves with training's collectives.
  ASSIGN_OR_RETURN(
      std::unique_ptr<Communicator> checkpoint,
      world_comm_->CreateSubgroup(ranks_.ShardGroup(rank_),
                                  absl::StrCat("checkpoint", ranks_.ReplicaIndex(rank_))));
  checkpoint_comm_ = observed(std::move(checkpoint), "checkpoint");
  const GradientDivideFactors divide =
      ComputeGradientDivideFactors(hybrid ? world_size_ : ranks_.shard_size);

  ASSIGN_OR_RETURN(std::vector<UnitLayout> layouts,
                   ComputeUnitLayouts(unit_specs_, sharding, ranks_));
  param_locations_.assign(index_.params.size(), ParamLocation{});
  for (size_t u = 0; u < unit_specs_.size(); ++u) {
    const Unit& unit = unit_specs_[u];
    UnitRuntimeConfig config{unit,      std::move(layouts[u].layout), ranks_.ShardRank(rank_),
                             strategy_, layouts[u].precision,         divide};
    config.cpu_offload = sharding.cpu_offload;
    for (size_t i = 0; i < unit.params.size(); ++i) {
      param_locations_[static_cast<size_t>(unit.params[i].param_index)] = ParamLocation{
          unit.index, config.layout.param_ranges()[i].start, unit.params[i].requires_grad};
    }
    unit_of_module_[unit.module_index] = unit.index;
    units_.push_back(std::make_unique<FlatParamUnit>(std::move(config), shard_comm,
                                                     replicate_comm_.get(), &memory_));
    optim_states_.push_back(
        MakeOptimizerState(options_.optimizer.kind, units_.back()->shard().size()));
  }
  states_.assign(units_.size(), UnitState::kSharded);
  gathers_.assign(units_.size(), nullptr);
  lane_ = std::make_unique<CommLane>();
  return InitializeParams();
}

absl::Status FsdpRuntime::InitializeParams() {
  // Every rank derives the same full values from (seed, FQN), flattens them as
  // FSDP does (padding 42) and keeps its shard. With sync_module_states rank 0's
  // values are broadcast instead, as FSDP does before sharding.
  for (const std::unique_ptr<FlatParamUnit>& unit : units_) {
    const FlatParamLayout& layout = unit->layout();
    std::vector<std::vector<float>> values;
    std::vector<std::span<const std::byte>> spans;
    values.reserve(layout.params().size());
    for (const UnitParam& p : unit->config().unit.params) {
      std::vector<float>& v = values.emplace_back(static_cast<size_t>(p.numel));
      const ParamSpec& spec = *index_.params[static_cast<size_t>(p.param_index)].spec;
      RETURN_IF_ERROR(compute::InitParam(spec, p.fqn, options_.seed, v));
      spans.push_back(std::as_bytes(std::span<const float>(v)));
    }
    std::vector<float> flat(static_cast<size_t>(layout.unpadded_unsharded_numel()));
    RETURN_IF_ERROR(
        FlattenParams(layout, DType::kFloat32, spans, std::as_writable_bytes(std::span(flat))));
    if (options_.sharding.sync_module_states) {
      RETURN_IF_ERROR(world_comm_->Broadcast(flat.data(), flat.size(), DType::kFloat32, 0));
    }
    RETURN_IF_ERROR(unit->LoadFull(flat));
  }
  return absl::OkStatus();
}

StepProgram FsdpRuntime::CompileProgram(bool sync_gradients) const {
  return CompileStepProgram(
      index_, unit_specs_,
      StepProgramOptionsFor(options_.sharding, options_.optimizer, world_size_, sync_gradients));
}

absl::StatusOr<StepStats> FsdpRuntime::RunStep(const StepProgram& program,
                                               const compute::Batch& batch) {
  const Clock::time_point start = Clock::now();
  program_ = &program;
  cursor_ = 0;
  stats_ = StepStats{};
  if (grads_stale_) {
    for (auto& unit : units_) unit->ClearGradShard();
    grads_stale_ = false;
  }
  absl::Status status = [&]() -> absl::Status {
    // NO_SHARD keeps whole parameters: build their compute views up front.
    if (!IsSharded(strategy_)) {
      for (auto& unit : units_) RETURN_IF_ERROR(unit->Gather());
    }
    ASSIGN_OR_RETURN(stats_.loss, model_->ForwardLoss(batch, *this, *this));
    RETURN_IF_ERROR(model_->Backward(*this, *this));
    RETURN_IF_ERROR(RunUntilMarker());
    if (cursor_ != program.size()) {
      return absl::InternalError(absl::StrCat(
          "step program has ", program.size() - cursor_,
          " commands left after the model finished, next: ", DescribeCommand(program[cursor_])));
    }
    const Clock::time_point drain = Clock::now();
    RETURN_IF_ERROR(lane_->Drain());
    stats_.exposed_comm_seconds += SecondsSince(drain);
    return absl::OkStatus();
  }();
  program_ = nullptr;
  if (!status.ok()) return status;
  const double seconds = SecondsSince(start);
  stats_.compute_seconds = seconds - stats_.exposed_comm_seconds - stats_.optimizer_seconds;
  if (options_.observer != nullptr) options_.observer->OnStep(stats_, seconds);
  return stats_;
}

absl::Status FsdpRuntime::OnMarker(bool backward, bool done, int module_index) {
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
  const StepCommand::Op marker = backward ? StepCommand::Op::kBackward : StepCommand::Op::kForward;
  const bool matches = next.op == marker && next.module == module_index && next.done == done;
  if (!matches) {
    return absl::InternalError(absl::StrCat(
        "the model reached ", describe(), " but the step program expects ", DescribeCommand(next)));
  }
  ++cursor_;
  return RunUntilMarker();
}

absl::Status FsdpRuntime::RunUntilMarker() {
  while (cursor_ < program_->size()) {
    const StepCommand& command = (*program_)[cursor_];
    if (command.is_marker()) return absl::OkStatus();
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
  if (it != unit_of_module_.end()) units_[static_cast<size_t>(it->second)]->EnsureGrad();
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
      for (auto& unit : units_) unit->ClearGradShard();
      return absl::OkStatus();
    case StepCommand::Op::kForward:
    case StepCommand::Op::kBackward:
    case StepCommand::Op::kBarrier:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("command ", DescribeCommand(command), " cannot run inside a step"));
}

absl::Status FsdpRuntime::RunControl(const StepProgram& program) {
  if (program_ != nullptr) {
    return absl::FailedPreconditionError("control commands cannot run inside a step");
  }
  for (const StepCommand& command : program) {
    switch (command.op) {
      case StepCommand::Op::kUnshard:
        RETURN_IF_ERROR(Unshard(command.unit, /*prefetch=*/false));
        break;
      case StepCommand::Op::kReshard:
        RETURN_IF_ERROR(Reshard(command.unit));
        break;
      case StepCommand::Op::kBarrier:
        RETURN_IF_ERROR(world_comm_->Barrier());
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("command ", DescribeCommand(command), " cannot run as a control command"));
    }
  }
  return absl::OkStatus();
}

void FsdpRuntime::Abort(const std::string& reason) {
  // Sub-groups first: a hybrid step may be blocked in either.
  if (checkpoint_comm_ != nullptr) checkpoint_comm_->Abort(reason);
  if (replicate_comm_ != nullptr) replicate_comm_->Abort(reason);
  if (shard_comm_ != nullptr) shard_comm_->Abort(reason);
  if (world_comm_ != nullptr) world_comm_->Abort(reason);
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
    // docs/fsdp-semantics.md §9.3: with limit_all_gathers at most two units (besides the
    // root, which stays unsharded through forward) are live. Frees happen
    // synchronously on this lane, so a prefetch that would exceed the cap is
    // dropped; the unit is gathered when it is needed instead.
    if (prefetch && options_.sharding.limit_all_gathers && !unit_specs_[u].is_root &&
        LiveNonRootUnits() >= 2) {
      return absl::OkStatus();
    }
    FlatParamUnit* target = units_[u].get();
    gathers_[u] = lane_->Submit([target] { return target->Gather(); });
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
  const Clock::time_point start = Clock::now();
  absl::Status status = gathers_[u]->Wait();
  stats_.exposed_comm_seconds += SecondsSince(start);
  gathers_[u] = nullptr;
  RETURN_IF_ERROR(status);
  states_[u] = UnitState::kUnsharded;
  return absl::OkStatus();
}

absl::Status FsdpRuntime::Reshard(int unit) {
  RETURN_IF_ERROR(CheckUnit(unit));
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
  FlatParamUnit* target = units_[static_cast<size_t>(unit)].get();
  // The lane owns the unsharded gradient from here until the reduction is done;
  // the compute lane does not touch it again this step.
  lane_->Submit([target] { return target->ReduceGrad(); });
  return absl::OkStatus();
}

absl::Status FsdpRuntime::ClipGradNorm(double max_norm, double norm_type) {
  ClipGradNormOptions clip;
  clip.max_norm = max_norm;
  clip.norm_type = norm_type;
  RETURN_IF_ERROR(ValidateClipGradNormOptions(clip));
  const Clock::time_point drain = Clock::now();
  RETURN_IF_ERROR(lane_->Drain());
  stats_.exposed_comm_seconds += SecondsSince(drain);
  std::vector<std::span<const float>> grads;
  for (auto& unit : units_) {
    if (unit->has_grad_shard()) grads.emplace_back(unit->grad_shard());
  }
  // docs/fsdp-semantics.md §8: sharded grads' local p-th powers (or max) are reduced over
  // the shard group; NO_SHARD grads are replicated, so the local norm is total.
  double local =
      IsInfNorm(norm_type) ? LocalGradNormInf(grads) : LocalGradNormPow(grads, norm_type);
  if (IsSharded(strategy_)) {
    Communicator* group = shard_comm_ != nullptr ? shard_comm_.get() : world_comm_.get();
    RETURN_IF_ERROR(group->AllReduce(&local, 1, DType::kFloat64,
                                     IsInfNorm(norm_type) ? ReduceOp::kMax : ReduceOp::kSum));
  }
  const double total = TotalNormFromReduced(local, /*nonsharded_pow_or_max=*/0.0, norm_type);
  stats_.grad_norm = total;
  const double coef = ClipCoefficient(max_norm, total);
  for (auto& unit : units_) {
    if (unit->has_grad_shard()) ScaleGrads(unit->grad_shard(), coef);
  }
  return absl::OkStatus();
}

absl::Status FsdpRuntime::OptimStep() {
  const Clock::time_point drain = Clock::now();
  RETURN_IF_ERROR(lane_->Drain());
  stats_.exposed_comm_seconds += SecondsSince(drain);
  // _catch_all_reshard: a unit still unsharded here would serve stale values
  // after the update, so every gathered buffer goes before the shards change.
  if (IsSharded(strategy_)) {
    for (size_t u = 0; u < units_.size(); ++u) {
      if (states_[u] != UnitState::kSharded) RETURN_IF_ERROR(Reshard(static_cast<int>(u)));
    }
  }
  const Clock::time_point start = Clock::now();
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatParamUnit& unit = *units_[u];
    if (!unit.has_grad_shard()) continue;  // torch skips params whose grad is None
    RETURN_IF_ERROR(
        OptimizerStep(options_.optimizer, unit.shard(), unit.grad_shard(), *optim_states_[u]));
  }
  grads_stale_ = true;
  stats_.optimizer_seconds += SecondsSince(start);
  return absl::OkStatus();
}

compute::ParamSlot FsdpRuntime::Resolve(int param_index) {
  const IndexedParam& param = index_.params[static_cast<size_t>(param_index)];
  const ParamLocation& where = param_locations_[static_cast<size_t>(param.primary)];
  FlatParamUnit& unit = *units_[static_cast<size_t>(where.unit)];
  compute::ParamSlot slot;
  if (unit.params() == nullptr) {
    // The program unshards a unit before its modules run; reaching this is a
    // bug in the schedule, and continuing would read freed memory.
    std::fprintf(stderr, "flatshard: parameter '%s' used while %s is sharded\n", param.fqn.c_str(),
                 UnitLabel(unit.config().unit).c_str());
    std::abort();
  }
  slot.value = unit.params() + where.offset;
  if (where.requires_grad && unit.grad() != nullptr) slot.grad = unit.grad() + where.offset;
  return slot;
}

}  // namespace flatshard
