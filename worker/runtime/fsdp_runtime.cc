// FsdpRuntime's construction, parameter initialisation, host access and
// parameter resolution. The step itself is in fsdp_runtime_step.cc, summon in
// fsdp_runtime_summon.cc.
#include "worker/runtime/fsdp_runtime.h"

#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"

#include "core/flat_buffer.h"
#include "core/status_macros.h"
#include "core/unit_layout.h"
#include "worker/comm/background_priority.h"
#include "worker/compute/param_init.h"
#include "worker/device/host/host_device.h"

namespace flatshard {

FsdpRuntime::FsdpRuntime(const ModelSpec& spec, ModelIndex index, RuntimeOptions options, int rank,
                         int world_size)
    : spec_(spec),
      index_(std::move(index)),
      options_(std::move(options)),
      rank_(rank),
      world_size_(world_size),
      strategy_(EffectiveStrategy(options_.sharding.strategy, world_size)) {}

FsdpRuntime::~FsdpRuntime() {
  if (compute_ == nullptr || comm_ == nullptr) return;
  // Everything still queued finishes, and each stream is ordered after the
  // other's work, so every buffer may be released on either of them.
  device_->MakeCurrent().IgnoreError();
  SynchronizeStreams().IgnoreError();
  if (absl::StatusOr<std::shared_ptr<Event>> e = compute_->Record(); e.ok()) {
    comm_->Wait(**e).IgnoreError();
  }
  if (absl::StatusOr<std::shared_ptr<Event>> e = comm_->Record(); e.ok()) {
    compute_->Wait(**e).IgnoreError();
  }
}

absl::StatusOr<std::unique_ptr<FsdpRuntime>> FsdpRuntime::Create(
    const ModelSpec& spec, const WrapPolicy& policy, const RuntimeOptions& options, int rank,
    int world_size, const std::shared_ptr<Store>& store) {
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, " is outside a world of size ", world_size));
  }
  ASSIGN_OR_RETURN(ModelIndex index, IndexModel(spec));
  std::unique_ptr<FsdpRuntime> runtime(
      new FsdpRuntime(spec, std::move(index), options, rank, world_size));
  RETURN_IF_ERROR(runtime->Build(policy, store));
  return runtime;
}

absl::Status FsdpRuntime::Build(const WrapPolicy& policy, const std::shared_ptr<Store>& store) {
  const ShardingSettings& sharding = options_.sharding;
  ASSIGN_OR_RETURN(
      ranks_, ComputeRankLayout(sharding.strategy, world_size_, sharding.hybrid_shard_group_size));
  ASSIGN_OR_RETURN(unit_specs_, ComputeUnits(index_, policy));
  RETURN_IF_ERROR(ValidateOptimizerSettings(options_.optimizer));

  device_ = options_.device != nullptr ? options_.device : std::make_shared<HostDevice>();
  RETURN_IF_ERROR(device_->MakeCurrent());
  ASSIGN_OR_RETURN(compute_, device_->CreateStream(StreamRole::kCompute, "compute"));
  ASSIGN_OR_RETURN(comm_, device_->CreateStream(StreamRole::kCommunication, "comm"));
  ASSIGN_OR_RETURN(model_, compute::Model::Create(spec_, index_, options_.loss,
                                                  {device_.get(), compute_.get(), &memory_}));

  const bool hybrid = IsHybrid(strategy_);
  GroupOptions groups;
  groups.backend = options_.comm;
  groups.gloo = options_.gloo;
  groups.observer = options_.observer;
  groups.peer_snapshots = options_.peer_snapshots;
  ASSIGN_OR_RETURN(
      groups_, ConnectRuntimeGroups(*device_, store, rank_, world_size_, ranks_, hybrid, groups));
  const GradientDivideFactors divide =
      ComputeGradientDivideFactors(hybrid ? world_size_ : ranks_.shard_size);

  ASSIGN_OR_RETURN(std::vector<UnitLayout> layouts,
                   ComputeUnitLayouts(unit_specs_, sharding, ranks_));
  UnitPlacement placement;
  placement.device = device_.get();
  placement.compute = compute_.get();
  placement.comm = comm_.get();
  placement.memory = &memory_;
  placement.shard = groups_.shard_group();
  placement.replicate = groups_.replicate.get();
  placement.host_shard = groups_.host_shard_group();
  param_locations_.assign(index_.params.size(), ParamLocation{});
  for (size_t u = 0; u < unit_specs_.size(); ++u) {
    const Unit& unit = unit_specs_[u];
    UnitRuntimeConfig config{unit,      std::move(layouts[u].layout), ranks_.ShardRank(rank_),
                             strategy_, layouts[u].precision,         divide};
    config.cpu_offload = sharding.cpu_offload;
    for (size_t i = 0; i < unit.params.size(); ++i) {
      const FlatRange& range = config.layout.param_ranges()[i];
      param_locations_[static_cast<size_t>(unit.params[i].param_index)] =
          ParamLocation{unit.index, range.start, range.numel(), unit.params[i].requires_grad};
    }
    unit_of_module_[unit.module_index] = unit.index;
    ASSIGN_OR_RETURN(std::unique_ptr<FlatParamUnit> built,
                     FlatParamUnit::Create(std::move(config), placement));
    units_.push_back(std::move(built));
    optim_states_.push_back(std::make_unique<DeviceOptimizerState>(
        options_.optimizer.kind, static_cast<size_t>(units_.back()->layout().sharded_numel()),
        device_.get(), compute_.get(), &memory_));
  }
  states_.assign(units_.size(), UnitState::kSharded);
  ASSIGN_OR_RETURN(norm_,
                   device_->Allocate(sizeof(double), *compute_, MemoryKind::kGradients, nullptr));
  ASSIGN_OR_RETURN(norm_host_, device_->AllocatePinned(sizeof(double)));
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
      RETURN_IF_ERROR(groups_.host_world->Broadcast(flat.data(), flat.size(), DType::kFloat32, 0));
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

void FsdpRuntime::Abort(const std::string& reason) {
  aborted_.store(true, std::memory_order_relaxed);
  groups_.Abort(reason);
}

absl::Status FsdpRuntime::SynchronizeStreams() {
  // Called from whichever thread serves the request (checkpoints, summon).
  RETURN_IF_ERROR(device_->MakeCurrent());
  absl::Status compute = compute_->Synchronize();
  absl::Status comm = comm_->Synchronize();
  absl::Status snapshot = snapshot_ != nullptr ? snapshot_->Synchronize() : absl::OkStatus();
  if (!compute.ok()) return compute;
  return comm.ok() ? snapshot : comm;
}

absl::StatusOr<Stream*> FsdpRuntime::BeginSnapshotCopies() {
  RETURN_IF_ERROR(device_->MakeCurrent());
  if (snapshot_ == nullptr) {
    // At background priority (nice 10, background_priority.h): on a host
    // device the copies run on the stream's own thread, which inherits it, so
    // they take the CPU the step leaves idle and do not delay the save's reply
    // or the next forward; the update that must wait for them still gets them.
    absl::StatusOr<std::unique_ptr<Stream>> created;
    RunAtBackgroundPriority([&] {
      if (absl::Status current = device_->MakeCurrent(); !current.ok()) {
        created = current;
        return;
      }
      created = device_->CreateStream(StreamRole::kCommunication, "snapshot");
    });
    ASSIGN_OR_RETURN(snapshot_, std::move(created));
  }
  // After every update issued so far, on either stream.
  ASSIGN_OR_RETURN(std::shared_ptr<Event> computed, compute_->Record());
  ASSIGN_OR_RETURN(std::shared_ptr<Event> communicated, comm_->Record());
  RETURN_IF_ERROR(snapshot_->Wait(*computed));
  RETURN_IF_ERROR(snapshot_->Wait(*communicated));
  return snapshot_.get();
}

absl::StatusOr<std::shared_ptr<Event>> FsdpRuntime::EndSnapshotCopies() {
  ASSIGN_OR_RETURN(snapshot_copied_, snapshot_->Record());
  return snapshot_copied_;
}

absl::Status FsdpRuntime::AwaitSnapshotCopies() {
  if (snapshot_copied_ == nullptr) return absl::OkStatus();
  RETURN_IF_ERROR(device_->MakeCurrent());
  RETURN_IF_ERROR(compute_->Wait(*snapshot_copied_));
  RETURN_IF_ERROR(comm_->Wait(*snapshot_copied_));
  snapshot_copied_.reset();
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<OptimizerState>> FsdpRuntime::ReadOptimizerState(size_t unit) const {
  return optim_states_[unit]->ToHost();
}

absl::Status FsdpRuntime::WriteOptimizerState(size_t unit,
                                              std::map<std::string, StagedFloats> states,
                                              float step) {
  RETURN_IF_ERROR(device_->MakeCurrent());
  return optim_states_[unit]->FromHost(std::move(states), step);
}

compute::ParamSlot FsdpRuntime::Resolve(int param_index) {
  const IndexedParam& param = index_.params[static_cast<size_t>(param_index)];
  const ParamLocation& where = param_locations_[static_cast<size_t>(param.primary)];
  FlatParamUnit& unit = *units_[static_cast<size_t>(where.unit)];
  if (!unit.has_params()) {
    // The program unshards a unit before its modules run; reaching this is a
    // bug in the schedule, and continuing would read freed memory.
    std::fprintf(stderr, "flatshard: parameter '%s' used while %s is sharded\n", param.fqn.c_str(),
                 UnitLabel(unit.config().unit).c_str());
    std::abort();
  }
  const auto offset = static_cast<size_t>(where.offset);
  const auto numel = static_cast<size_t>(where.numel);
  compute::ParamSlot slot;
  slot.value = unit.params().subspan(offset, numel);
  if (where.requires_grad && !unit.grad().empty()) slot.grad = unit.grad().subspan(offset, numel);
  return slot;
}

}  // namespace flatshard
