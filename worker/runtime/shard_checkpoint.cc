#include "worker/runtime/shard_checkpoint.h"

#include <functional>
#include <map>
#include <memory>
#include <utility>

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

#include "core/model_spec.h"
#include "core/sharded_tensor_pieces.h"
#include "core/status_macros.h"
#include "storage/durable_file.h"
#include "worker/device/host/host_device.h"
#include "worker/runtime/save_pieces.h"
#include "worker/runtime/save_writer.h"

namespace flatshard {

std::string LocalLayoutDigest(const FsdpRuntime& runtime) {
  std::string text = absl::StrCat("world=", runtime.world_size(), ";");
  for (const auto& unit : runtime.units()) {
    const FlatParamLayout& layout = unit->layout();
    absl::StrAppend(&text, "unit=", unit->config().unit.index, ",", unit->config().unit.module_fqn,
                    ",S=", layout.sharded_numel(), ",W=", layout.world_size(),
                    ",shard_rank=", unit->config().shard_rank,
                    ",numels=", absl::StrJoin(layout.numels_with_padding(), "/"), ",params=");
    for (const FlatParamEntry& p : layout.params()) {
      absl::StrAppend(&text, p.fqn, "[", absl::StrJoin(p.shape, "x"), "]");
    }
    absl::StrAppend(&text, ";");
  }
  return Xxh3Hex(XXH3_64bits(text.data(), text.size()));
}

namespace {

// torch's optimizer param_groups as a full optimizer state dict lists them
// (docs/fsdp-semantics.md §6.3: every FQN of every parameter, hyperparameters as they are).
std::string ParamGroupsJson(const FsdpRuntime& runtime) {
  nlohmann::ordered_json group;
  const OptimizerSettings& optimizer = runtime.options().optimizer;
  if (optimizer.kind == OptimizerKind::kSgd) {
    const SgdOptions& o = optimizer.sgd;
    group = {{"lr", o.lr},
             {"momentum", o.momentum},
             {"dampening", o.dampening},
             {"weight_decay", o.weight_decay},
             {"nesterov", o.nesterov},
             {"maximize", o.maximize}};
  } else {
    const AdamOptions& o = optimizer.adam;
    group = {{"lr", o.lr},           {"betas", {o.beta1, o.beta2}},
             {"eps", o.eps},         {"weight_decay", o.weight_decay},
             {"amsgrad", o.amsgrad}, {"maximize", o.maximize}};
  }
  nlohmann::ordered_json params = nlohmann::ordered_json::array();
  for (const auto& unit : runtime.units()) {
    for (const UnitParam& p : unit->config().unit.params) params.push_back(p.fqn);
    for (const SharedParam& p : unit->config().unit.shared) params.push_back(p.fqn);
  }
  group["params"] = params;
  return nlohmann::ordered_json::array({group}).dump();
}

// A synchronous save on the CPU device: the shards and optimizer state are
// host memory already and training is not running, so the writers read them
// where they are, with no copy (and no second copy of the state kept for the
// next save).
class LiveHostSource : public SaveSource {
 public:
  // Null when the runtime's device is not host memory.
  static absl::StatusOr<std::unique_ptr<LiveHostSource>> Create(FsdpRuntime& runtime) {
    if (dynamic_cast<HostDevice*>(&runtime.device()) == nullptr) return nullptr;
    RETURN_IF_ERROR(runtime.SynchronizeStreams());
    return std::unique_ptr<LiveHostSource>(new LiveHostSource(runtime));
  }
  std::span<const float> Shard(size_t u) const override {
    const DeviceSpan<float> shard = runtime_.units()[u]->shard();
    return {HostDevice::HostAddress(shard), shard.size()};
  }
  absl::StatusOr<std::span<const float>> State(size_t u, const std::string& name) const override {
    ASSIGN_OR_RETURN(DeviceSpan<const float> tensor, runtime_.OptimizerStateTensor(u, name));
    return std::span<const float>(HostDevice::HostAddress(tensor), tensor.size());
  }
  std::vector<std::string> StateNames(size_t u) const override {
    return runtime_.OptimizerStateNames(u);
  }
  float Step(size_t u) const override { return static_cast<float>(runtime_.OptimizerStep(u)); }

 private:
  explicit LiveHostSource(FsdpRuntime& runtime) : runtime_(runtime) {}
  FsdpRuntime& runtime_;
};

// An async save's source: copies of this rank's shards and optimizer state.
// Create() reads the pinned copies once they are complete.
class SnapshotSource : public SaveSource {
 public:
  static absl::StatusOr<std::unique_ptr<SnapshotSource>> Create(const ShardSnapshot& snapshot) {
    if (snapshot.copied != nullptr) RETURN_IF_ERROR(snapshot.copied->Synchronize());
    std::unique_ptr<SnapshotSource> source(new SnapshotSource(snapshot));
    for (const ShardSnapshot::Unit& unit : snapshot.units) {
      Views& views = source->views_.emplace_back();
      ASSIGN_OR_RETURN(views.shard, unit.shard.Read<float>());
      for (const auto& [name, buffer] : unit.states) {
        ASSIGN_OR_RETURN(views.states[name], buffer.Read<float>());
      }
    }
    return source;
  }
  std::span<const float> Shard(size_t u) const override { return views_[u].shard; }
  absl::StatusOr<std::span<const float>> State(size_t u, const std::string& name) const override {
    auto it = views_[u].states.find(name);
    if (it == views_[u].states.end()) {
      return absl::NotFoundError(absl::StrCat("no optimizer state '", name, "' in the snapshot"));
    }
    return it->second;
  }
  std::vector<std::string> StateNames(size_t u) const override {
    return snapshot_.units[u].state_order;
  }
  float Step(size_t u) const override { return snapshot_.units[u].step; }

 private:
  struct Views {
    std::span<const float> shard;
    std::map<std::string, std::span<const float>> states;
  };
  explicit SnapshotSource(const ShardSnapshot& snapshot) : snapshot_(snapshot) {}

  const ShardSnapshot& snapshot_;
  std::vector<Views> views_;
};

absl::StatusOr<SavePlan> PlanSave(FsdpRuntime& runtime, v1::StateDictType type) {
  SavePlan plan;
  plan.rank = runtime.rank();
  plan.world = runtime.world_size();
  plan.type = type;
  const auto& units = runtime.units();
  if (type != v1::FULL_STATE_DICT && !units.empty() && !units.front()->sharded()) {
    return absl::FailedPreconditionError(
        absl::StrCat(StateDictTypeName(type),
                     " needs a sharded strategy; this job does not shard (use "
                     "FULL_STATE_DICT)"));
  }
  plan.pieces.resize(units.size());
  for (size_t u = 0; u < units.size(); ++u) {
    plan.pieces[u] =
        UnitPieces(*units[u], runtime.OptimizerStateNames(u), type, plan.rank, plan.world);
    plan.ranges.push_back(RangeWrittenBy(*units[u], plan.rank, plan.world));
    for (const Piece& piece : plan.pieces[u]) {
      (piece.optim ? plan.optim : plan.model).slots.push_back(piece.slot);
    }
  }
  std::map<std::string, int64_t> model_offsets, optim_offsets;
  for (const std::vector<Piece>& pieces : plan.pieces) {
    for (const Piece& piece : pieces) {
      if (piece.element_offset < 0) continue;
      (piece.optim ? optim_offsets : model_offsets)[piece.slot.name] = piece.element_offset;
    }
  }
  const bool full = type == v1::FULL_STATE_DICT;
  std::map<std::string, std::string> metadata = {
      {"format", "flatshard"},
      {"state_dict_type", std::string(StateDictTypeName(type))},
      {"world_size", absl::StrCat(plan.world)}};
  // Every rank writes part of a FULL file: its header, which each computes
  // to find where its bytes go, must be the same on all.
  if (!full) metadata["rank"] = absl::StrCat(plan.rank);
  if (type == v1::LOCAL_STATE_DICT) metadata["layout_digest"] = LocalLayoutDigest(runtime);
  plan.model.name =
      full ? std::string(kFullModelFile) : RankFileName("model", plan.rank, plan.world);
  plan.optim.name =
      full ? std::string(kFullOptimFile) : RankFileName("optim", plan.rank, plan.world);
  plan.model.metadata = metadata;
  plan.optim.metadata = std::move(metadata);
  plan.optim.metadata["param_groups"] = ParamGroupsJson(runtime);
  if (type == v1::SHARDED_STATE_DICT) {
    plan.model.metadata[std::string(kElementOffsetsKey)] = ElementOffsetsToJson(model_offsets);
    plan.optim.metadata[std::string(kElementOffsetsKey)] = ElementOffsetsToJson(optim_offsets);
  }
  return plan;
}

}  // namespace

absl::StatusOr<ShardSaveResult> SaveShardCheckpoint(FsdpRuntime& runtime, const std::string& dir,
                                                    v1::StateDictType type) {
  ASSIGN_OR_RETURN(std::unique_ptr<LiveHostSource> live, LiveHostSource::Create(runtime));
  // Asked before each chunk written: each counts as progress.
  const std::function<bool()> aborted = [&runtime] {
    runtime.NoteProgress();
    return runtime.aborted();
  };
  if (live != nullptr) {
    ASSIGN_OR_RETURN(SavePlan plan, PlanSave(runtime, type));
    return WriteSaveFiles(*live, plan, dir, runtime.options().file_system, aborted);
  }
  // The shards live on the device: a save copies them (and the optimizer
  // state) to host memory first, then writes from the copies.
  ASSIGN_OR_RETURN(ShardSnapshot snapshot, SnapshotShardCheckpoint(runtime, type));
  return WriteShardSnapshot(snapshot, dir, aborted);
}

absl::StatusOr<ShardSnapshot> SnapshotShardCheckpoint(FsdpRuntime& runtime,
                                                      v1::StateDictType type) {
  ASSIGN_OR_RETURN(SavePlan plan, PlanSave(runtime, type));
  ShardSnapshot snapshot;
  snapshot.plan = std::make_shared<const SavePlan>(std::move(plan));
  snapshot.file_system = runtime.options().file_system;
  // One copy of each buffer into pinned host memory the snapshot keeps (the
  // device's block cache hands the same blocks back save after save, so no
  // page is faulted in), enqueued on the snapshot stream behind every update
  // issued so far. Whatever happens, the copies get their completion event:
  // the snapshot waits for it before it frees their memory.
  ASSIGN_OR_RETURN(Stream * stream, runtime.BeginSnapshotCopies());
  absl::Status copying = [&]() -> absl::Status {
    for (size_t u = 0; u < runtime.units().size(); ++u) {
      const FlatParamUnit& unit = *runtime.units()[u];
      ShardSnapshot::Unit& copy = snapshot.units.emplace_back();
      ASSIGN_OR_RETURN(copy.shard, unit.CopyShardToPinned(*stream));
      copy.state_order = runtime.OptimizerStateNames(u);
      for (const std::string& name : copy.state_order) {
        ASSIGN_OR_RETURN(copy.states[name], runtime.CopyOptimizerStateToPinned(u, name, *stream));
      }
      copy.step = static_cast<float>(runtime.OptimizerStep(u));
    }
    return absl::OkStatus();
  }();
  absl::StatusOr<std::shared_ptr<Event>> copied = runtime.EndSnapshotCopies();
  if (!copied.ok()) {
    // No event to wait for: wait for the stream, so no copy outlives its memory.
    runtime.SynchronizeStreams().IgnoreError();
    snapshot.units.clear();
    return copied.status();
  }
  snapshot.copied = *std::move(copied);
  RETURN_IF_ERROR(copying);
  return snapshot;
}

absl::StatusOr<ShardSaveResult> WriteShardSnapshot(const ShardSnapshot& snapshot,
                                                   const std::string& dir,
                                                   const std::function<bool()>& aborted) {
  ASSIGN_OR_RETURN(std::unique_ptr<SnapshotSource> source, SnapshotSource::Create(snapshot));
  return WriteSaveFiles(*source, *snapshot.plan, dir, snapshot.file_system, aborted);
}

ShardSnapshot::~ShardSnapshot() {
  if (copied != nullptr) copied->Synchronize().IgnoreError();
}

uint64_t ShardSnapshot::bytes() const {
  uint64_t total = 0;
  for (const Unit& unit : units) {
    total += unit.shard.bytes();
    for (const auto& [name, buffer] : unit.states) total += buffer.bytes();
  }
  return total;
}

}  // namespace flatshard
