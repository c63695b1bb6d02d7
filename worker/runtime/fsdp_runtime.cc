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
#include "worker/comm/observed_communicator.h"
#include "worker/compute/param_init.h"

namespace flatshard {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

FsdpRuntime::FsdpRuntime(const ModelSpec& spec, ModelIndex index, FsdpOptions options, int rank,
                         int world_size)
    : spec_(spec),
      index_(std::move(index)),
      options_(std::move(options)),
      rank_(rank),
      world_size_(world_size),
      strategy_(EffectiveStrategy(options_.strategy, world_size)) {}

FsdpRuntime::~FsdpRuntime() {
  if (lane_ != nullptr) lane_->Drain().IgnoreError();
}

absl::StatusOr<std::unique_ptr<FsdpRuntime>> FsdpRuntime::Create(const ModelSpec& spec,
                                                                 const WrapPolicy& policy,
                                                                 const FsdpOptions& options,
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
  ASSIGN_OR_RETURN(
      ranks_, ComputeRankLayout(options_.strategy, world_size_, options_.hybrid_shard_group_size));
  ASSIGN_OR_RETURN(unit_specs_, ComputeUnits(index_, policy));
  ASSIGN_OR_RETURN(model_, compute::Model::Create(spec_, index_, options_.loss));
  switch (options_.optimizer.kind) {
    case OptimizerConfig::Kind::kSgd:
      RETURN_IF_ERROR(ValidateSgdOptions(options_.optimizer.sgd));
      break;
    case OptimizerConfig::Kind::kAdam:
    case OptimizerConfig::Kind::kAdamW:
      RETURN_IF_ERROR(ValidateAdamOptions(options_.optimizer.adam));
      break;
  }

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

  param_locations_.assign(index_.params.size(), ParamLocation{});
  for (const Unit& unit : unit_specs_) {
    std::vector<FlatParamEntry> entries;
    for (const UnitParam& p : unit.params) {
      entries.push_back(FlatParamEntry{p.fqn, p.shape, p.dtype, p.requires_grad});
    }
    const ResolvedPrecision precision =
        ResolvePrecision(entries.front().dtype, options_.param_dtype, options_.reduce_dtype);
    FlatParamLayoutOptions layout_options;
    layout_options.world_size = ranks_.shard_size;
    layout_options.sharded = IsSharded(strategy_);
    layout_options.use_orig_params = options_.use_orig_params;
    layout_options.has_compute_dtype = precision.uses_param_mixed_precision;
    layout_options.compute_dtype = precision.param_dtype;
    ASSIGN_OR_RETURN(FlatParamLayout layout,
                     FlatParamLayout::Create(std::move(entries), layout_options, UnitLabel(unit)));
    UnitRuntimeConfig config{unit,      std::move(layout), ranks_.ShardRank(rank_),
                             strategy_, precision,         divide};
    config.cpu_offload = options_.cpu_offload;
    for (size_t i = 0; i < unit.params.size(); ++i) {
      param_locations_[static_cast<size_t>(unit.params[i].param_index)] = ParamLocation{
          unit.index, config.layout.param_ranges()[i].start, unit.params[i].requires_grad};
    }
    unit_of_module_[unit.module_index] = unit.index;
    units_.push_back(std::make_unique<FlatParamUnit>(std::move(config), shard_comm,
                                                     replicate_comm_.get(), &memory_));
    const size_t s = units_.back()->shard().size();
    if (options_.optimizer.kind == OptimizerConfig::Kind::kSgd) {
      optim_states_.push_back(std::make_unique<SgdState>(s));
    } else {
      optim_states_.push_back(std::make_unique<AdamState>(s));
    }
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
    if (options_.sync_module_states) {
      RETURN_IF_ERROR(world_comm_->Broadcast(flat.data(), flat.size(), DType::kFloat32, 0));
    }
    RETURN_IF_ERROR(unit->LoadFull(flat));
  }
  return absl::OkStatus();
}

std::vector<v1::Command> FsdpRuntime::CompileProgram(bool sync_gradients) const {
  StepProgramOptions options;
  options.strategy = strategy_;
  options.backward_prefetch = options_.backward_prefetch;
  options.forward_prefetch = options_.forward_prefetch;
  options.sync_gradients = sync_gradients;
  options.max_grad_norm = options_.max_grad_norm;
  options.grad_norm_type = options_.grad_norm_type;
  return CompileStepProgram(index_, unit_specs_, options);
}

absl::StatusOr<StepStats> FsdpRuntime::RunStep(const std::vector<v1::Command>& program,
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
  const v1::Command& next = (*program_)[cursor_];
  const bool matches = backward ? next.has_backward() && next.backward().module() == module_index &&
                                      next.backward().done() == done
                                : next.has_forward() && next.forward().module() == module_index &&
                                      next.forward().done() == done;
  if (!matches) {
    return absl::InternalError(absl::StrCat(
        "the model reached ", describe(), " but the step program expects ", DescribeCommand(next)));
  }
  ++cursor_;
  return RunUntilMarker();
}

absl::Status FsdpRuntime::RunUntilMarker() {
  while (cursor_ < program_->size()) {
    const v1::Command& command = (*program_)[cursor_];
    if (command.has_forward() || command.has_backward()) return absl::OkStatus();
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

absl::Status FsdpRuntime::Execute(const v1::Command& command) {
  switch (command.op_case()) {
    case v1::Command::kUnshard:
      return Unshard(command.unshard().unit(), command.unshard().prefetch());
    case v1::Command::kReshard:
      return Reshard(command.reshard().unit());
    case v1::Command::kReduceGrad:
      return ReduceGrad(command.reduce_grad().unit());
    case v1::Command::kClipGradNorm:
      return ClipGradNorm(command.clip_grad_norm().max_norm(),
                          command.clip_grad_norm().norm_type());
    case v1::Command::kOptimStep:
      return OptimStep();
    case v1::Command::kZeroGrad:
      for (auto& unit : units_) unit->ClearGradShard();
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("command ", DescribeCommand(command), " cannot run inside a step"));
  }
}

absl::Status FsdpRuntime::RunControl(const std::vector<v1::Command>& program) {
  if (program_ != nullptr) {
    return absl::FailedPreconditionError("control commands cannot run inside a step");
  }
  for (const v1::Command& command : program) {
    switch (command.op_case()) {
      case v1::Command::kUnshard:
        RETURN_IF_ERROR(Unshard(command.unshard().unit(), /*prefetch=*/false));
        break;
      case v1::Command::kReshard:
        RETURN_IF_ERROR(Reshard(command.reshard().unit()));
        break;
      case v1::Command::kBarrier:
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
    if (prefetch && options_.limit_all_gathers && !unit_specs_[u].is_root &&
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
    if (options_.optimizer.kind == OptimizerConfig::Kind::kSgd) {
      RETURN_IF_ERROR(SgdStep(unit.shard(), unit.grad_shard(),
                              static_cast<SgdState&>(*optim_states_[u]), options_.optimizer.sgd));
    } else {
      AdamOptions adam = options_.optimizer.adam;
      adam.decoupled_weight_decay = options_.optimizer.kind == OptimizerConfig::Kind::kAdamW;
      RETURN_IF_ERROR(AdamStep(unit.shard(), unit.grad_shard(),
                               static_cast<AdamState&>(*optim_states_[u]), adam));
    }
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

absl::Status FsdpRuntime::SummonFullParams(
    const SummonOptions& options, const std::function<absl::Status(SummonedParams&)>& body) {
  if (options.with_grads && (!options_.use_orig_params || options.offload_to_cpu)) {
    return absl::UnimplementedError(
        "summon_full_params: with_grads needs use_orig_params=True and offload_to_cpu=False");
  }
  if (options.offload_to_cpu && !IsSharded(strategy_)) {
    return absl::UnimplementedError(
        "summon_full_params: offload_to_cpu is not supported with NO_SHARD");
  }
  if (options.writeback && options.rank0_only) {
    return absl::UnimplementedError(
        "summon_full_params: writeback with rank0_only is not supported");
  }
  if (program_ != nullptr) {
    return absl::FailedPreconditionError(
        "summon_full_params: cannot manually unshard parameters during forward/backward");
  }
  RETURN_IF_ERROR(lane_->Drain());
  SummonedParams summoned;
  std::vector<std::vector<float>> flats(units_.size());
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatParamUnit& unit = *units_[u];
    RETURN_IF_ERROR(unit.GatherFullPrecision(flats[u]));
    std::vector<float> grad_flat;
    if (options.with_grads) RETURN_IF_ERROR(unit.GatherGradFullPrecision(grad_flat));
    if (options.rank0_only && rank_ != 0) continue;
    const Unit& spec = unit.config().unit;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const FlatRange& range = unit.layout().param_ranges()[i];
      summoned.params[spec.params[i].fqn].assign(flats[u].begin() + range.start,
                                                 flats[u].begin() + range.end + 1);
      if (!grad_flat.empty()) {
        summoned.grads[spec.params[i].fqn].assign(grad_flat.begin() + range.start,
                                                  grad_flat.begin() + range.end + 1);
      }
    }
    for (const SharedParam& shared : spec.shared) {
      summoned.params[shared.fqn] = summoned.params[shared.primary_fqn];
    }
  }
  RETURN_IF_ERROR(body(summoned));
  if (!options.writeback) return absl::OkStatus();
  for (size_t u = 0; u < units_.size(); ++u) {
    FlatParamUnit& unit = *units_[u];
    const Unit& spec = unit.config().unit;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const std::vector<float>& values = summoned.params[spec.params[i].fqn];
      const FlatRange& range = unit.layout().param_ranges()[i];
      if (values.size() != static_cast<size_t>(range.numel())) {
        return absl::InvalidArgumentError(
            absl::StrCat("summon_full_params: cannot writeback when the parameter shape changes ('",
                         spec.params[i].fqn, "' has ", values.size(), " elements, expected ",
                         range.numel(), ")"));
      }
      std::copy(values.begin(), values.end(), flats[u].begin() + range.start);
    }
    RETURN_IF_ERROR(unit.WriteBackFull(flats[u]));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::map<std::string, std::vector<float>>> FsdpRuntime::SummonFullParams() {
  RETURN_IF_ERROR(lane_->Drain());
  std::map<std::string, std::vector<float>> out;
  for (auto& unit : units_) {
    std::vector<float> flat;
    RETURN_IF_ERROR(unit->GatherFullPrecision(flat));
    const Unit& spec = unit->config().unit;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const FlatRange& range = unit->layout().param_ranges()[i];
      out[spec.params[i].fqn].assign(flat.begin() + range.start, flat.begin() + range.end + 1);
    }
    for (const SharedParam& shared : spec.shared) out[shared.fqn] = out[shared.primary_fqn];
  }
  return out;
}

}  // namespace flatshard
