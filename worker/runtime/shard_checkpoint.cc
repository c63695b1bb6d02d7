#include "worker/runtime/shard_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

#include "core/model_spec.h"
#include "core/sharded_tensor_pieces.h"
#include "core/status_macros.h"
#include "storage/checkpoint_reader.h"
#include "storage/durable_file.h"
#include "storage/safetensors_file_writer.h"
#include "storage/safetensors_region_writer.h"
#include "worker/device/host/host_device.h"
#include "worker/runtime/save_pieces.h"

namespace flatshard {
namespace {

// Collects a file's write error and keeps going, so a rank whose disk fails
// still returns its other files' outcome with the error (no save has a
// collective left to hang on, but the rank reports one status for the save).
// A FULL file is written by every rank at once, each its own elements in
// place (SafetensorsRegionWriter); the others have one writer.
class TolerantWriter {
 public:
  TolerantWriter(const std::string& path, const SavePlanFile& file, bool shared, int rank,
                 FileSystem* fs)
      : name_(std::filesystem::path(path).filename().string()), rank_(rank) {
    if (shared) {
      auto writer = SafetensorsRegionWriter::Open(path, file.slots, file.metadata,
                                                  /*writes_header=*/rank == 0, fs);
      if (writer.ok()) {
        shared_ = *std::move(writer);
      } else {
        status_ = writer.status();
      }
    } else {
      auto writer = SafetensorsFileWriter::Create(path, file.slots, file.metadata, fs);
      if (writer.ok()) {
        whole_ = *std::move(writer);
      } else {
        status_ = writer.status();
      }
    }
  }
  // Elements [begin, begin + values.size()) of tensor `name` (a whole
  // tensor, in file order, unless the file is shared).
  void Write(const std::string& name, uint64_t begin, std::span<const float> values) {
    if (!status_.ok()) return;
    status_ =
        shared_ != nullptr ? shared_->Write(name, begin, values) : whole_->Append(name, values);
  }
  // Its manifest entry; none for a shared file this rank wrote nothing of.
  absl::StatusOr<std::optional<CheckpointFile>> Finish() {
    RETURN_IF_ERROR(status_);
    if (shared_ != nullptr) {
      ASSIGN_OR_RETURN(SafetensorsRegionWriter::Written written, shared_->Finish());
      if (written.regions.empty()) return std::nullopt;
      return CheckpointFile{name_, rank_, written.file_bytes, "", std::move(written.regions)};
    }
    ASSIGN_OR_RETURN(FileDigest digest, whole_->Finish());
    return CheckpointFile{name_, rank_, digest.bytes, digest.xxh3, {}};
  }

 private:
  std::string name_;
  int rank_;
  std::unique_ptr<SafetensorsFileWriter> whole_;
  std::unique_ptr<SafetensorsRegionWriter> shared_;
  absl::Status status_;
};

// What a save reads: the live runtime (a synchronous save, on the executor's
// thread) or a snapshot of this rank's shards (an async save, on a background
// thread).
class SaveSource {
 public:
  virtual ~SaveSource() = default;
  virtual std::span<const float> Shard(size_t unit) const = 0;
  virtual absl::StatusOr<std::span<const float>> State(size_t unit,
                                                       const std::string& name) const = 0;
  virtual std::vector<std::string> StateNames(size_t unit) const = 0;
  virtual float Step(size_t unit) const = 0;
};

}  // namespace

// The files one rank writes and what goes into them, fixed when the save
// starts (an async save writes it later from a snapshot).
struct SavePlan {
  int rank = 0;
  int world = 1;
  v1::StateDictType type = v1::FULL_STATE_DICT;
  std::vector<std::vector<Piece>> pieces;  // per unit
  // FULL, per unit: the elements of the flat value this rank writes (the
  // pieces are whole tensors; each rank writes its part of them in place).
  std::vector<WrittenRange> ranges;
  SavePlanFile model, optim;
};

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

// Writes every piece this rank holds into its files. SHARDED and LOCAL:
// this rank's own elements, straight from its shard and states. FULL: the
// same elements, at their places in the whole tensors of the shared files
// (the pieces are whole tensors in file order, so each rank's writes go
// forward through each file); rank 0 writes the 0-dim steps. No collective:
// nothing moves between ranks, so `aborted` (if set) is asked before each
// write of at most kSaveWriteChunk elements (a piece, one tensor's part, is
// written in such chunks), and an aborted save lets go within one chunk
// rather than one tensor, however large.
absl::Status StreamSave(SaveSource& source, const SavePlan& plan, TolerantWriter& model,
                        TolerantWriter& optim, const std::function<bool()>& aborted) {
  const bool full = plan.type == v1::FULL_STATE_DICT;
  for (size_t u = 0; u < plan.pieces.size(); ++u) {
    const float step = source.Step(u);
    const auto stopped = [&]() -> absl::Status {
      if (!aborted || !aborted()) return absl::OkStatus();
      return absl::AbortedError(
          absl::StrCat("the save was aborted after ", u, " of ", plan.pieces.size(), " units"));
    };
    for (const Piece& piece : plan.pieces[u]) {
      RETURN_IF_ERROR(stopped());
      TolerantWriter& raw = piece.optim ? optim : model;
      // Elements [begin, begin + values.size()) of tensor `name`, a chunk
      // at a time (the first after the check above).
      const auto write = [&](const std::string& name, uint64_t begin,
                             std::span<const float> values) -> absl::Status {
        for (size_t k = 0; k == 0 || k < values.size(); k += kSaveWriteChunk) {
          if (k > 0) RETURN_IF_ERROR(stopped());
          raw.Write(name, begin + k,
                    values.subspan(k, std::min(kSaveWriteChunk, values.size() - k)));
        }
        return absl::OkStatus();
      };
      if (piece.source == Piece::Source::kStep) {
        if (!full || plan.rank == 0) {
          raw.Write(piece.slot.name, 0, std::span<const float>(&step, 1));
        }
        continue;
      }
      std::span<const float> values;
      if (piece.source == Piece::Source::kParam || piece.source == Piece::Source::kLocalFlat) {
        values = source.Shard(u);
      } else {
        ASSIGN_OR_RETURN(values, source.State(u, piece.state));
      }
      if (!full) {
        RETURN_IF_ERROR(write(piece.slot.name, 0,
                              values.subspan(static_cast<size_t>(piece.flat_begin),
                                             static_cast<size_t>(piece.count))));
        continue;
      }
      const WrittenRange& mine = plan.ranges[u];
      const int64_t from = std::max(mine.begin, piece.flat_begin);
      const int64_t to = std::min(mine.end, piece.flat_begin + piece.count);
      if (from >= to) continue;
      RETURN_IF_ERROR(write(piece.slot.name, static_cast<uint64_t>(from - piece.flat_begin),
                            values.subspan(static_cast<size_t>(from - mine.shard_begin),
                                           static_cast<size_t>(to - from))));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

ShardSaveResult FinishWriters(const std::vector<TolerantWriter*>& writers) {
  ShardSaveResult result;
  for (TolerantWriter* writer : writers) {
    absl::StatusOr<std::optional<CheckpointFile>> file = writer->Finish();
    if (!file.ok()) {
      if (result.write_status.ok()) result.write_status = file.status();
      continue;
    }
    if (file->has_value()) result.files.push_back(**std::move(file));
  }
  return result;
}

// Streams `source` into this rank's files in `dir`.
absl::StatusOr<ShardSaveResult> WriteFiles(SaveSource& source, const SavePlan& plan,
                                           const std::string& dir, FileSystem* fs,
                                           const std::function<bool()>& aborted) {
  // Not one file for a save aborted before it began (a FULL file's header
  // would stay behind: shared files are not removed by their writers).
  if (aborted && aborted()) {
    return absl::AbortedError(
        absl::StrCat("the save was aborted after 0 of ", plan.pieces.size(), " units"));
  }
  const bool shared = plan.type == v1::FULL_STATE_DICT;
  TolerantWriter model(absl::StrCat(dir, "/", plan.model.name), plan.model, shared, plan.rank, fs);
  TolerantWriter optim(absl::StrCat(dir, "/", plan.optim.name), plan.optim, shared, plan.rank, fs);
  RETURN_IF_ERROR(StreamSave(source, plan, model, optim, aborted));
  return FinishWriters({&model, &optim});
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
    return WriteFiles(*live, plan, dir, runtime.options().file_system, aborted);
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
  return WriteFiles(*source, *snapshot.plan, dir, snapshot.file_system, aborted);
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
