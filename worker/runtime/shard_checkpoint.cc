#include "worker/runtime/shard_checkpoint.h"

#include <algorithm>
#include <array>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <utility>

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "nlohmann/json.hpp"

#include "core/checkpoint_reader.h"
#include "core/durable_file.h"
#include "core/model_spec.h"
#include "core/safetensors_file_writer.h"
#include "core/sharded_tensor_pieces.h"
#include "core/status_macros.h"
#include "worker/device/host/host_device.h"
#include "worker/device/host/stream_thread.h"
#include "worker/runtime/save_pieces.h"

namespace flatshard {
namespace {

// Where a save's tensors go, in file order: straight into the file (a
// synchronous save) or into host memory (an async save's snapshot).
class TensorSink {
 public:
  virtual ~TensorSink() = default;
  virtual void Append(const std::string& name, std::span<const float> values) = 0;
};

// Collects a file's write error and keeps going, so a rank whose disk fails
// still joins every collective of the save and its peers do not hang.
class TolerantWriter : public TensorSink {
 public:
  TolerantWriter(const std::string& path, std::vector<SafetensorsSlot> slots,
                 const std::map<std::string, std::string>& metadata, int rank, FileSystem* fs)
      : name_(std::filesystem::path(path).filename().string()), rank_(rank) {
    absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> writer =
        SafetensorsFileWriter::Create(path, std::move(slots), metadata, fs);
    if (writer.ok()) {
      writer_ = *std::move(writer);
    } else {
      status_ = writer.status();
    }
  }
  void Append(const std::string& name, std::span<const float> values) override {
    if (status_.ok()) status_ = writer_->Append(name, values);
  }
  absl::StatusOr<CheckpointFile> Finish() {
    RETURN_IF_ERROR(status_);
    ASSIGN_OR_RETURN(FileDigest digest, writer_->Finish());
    return CheckpointFile{name_, rank_, digest.bytes, digest.xxh3, {}};
  }

 private:
  std::string name_;
  int rank_;
  std::unique_ptr<SafetensorsFileWriter> writer_;
  absl::Status status_;
};

// What a save reads: the live runtime (a synchronous save, on the executor's
// thread) or a snapshot of this rank's shards (an async save, on a background
// thread, gathering over the checkpoint communicator).
class SaveSource {
 public:
  virtual ~SaveSource() = default;
  virtual std::span<const float> Shard(size_t unit) const = 0;
  virtual absl::StatusOr<std::span<const float>> State(size_t unit,
                                                       const std::string& name) const = 0;
  virtual std::vector<std::string> StateNames(size_t unit) const = 0;
  virtual float Step(size_t unit) const = 0;
  // FULL: gathers per-element shard values of `unit` (S) to the one writer as
  // the unpadded flat value (N); the other ranks get nothing. (SHARDED and
  // LOCAL write from their own shards.)
  virtual absl::Status Gather(size_t unit, std::span<const float> values,
                              std::vector<float>& out) = 0;
};

}  // namespace

// The files one rank writes and what goes into them, fixed when the save
// starts (an async save writes it later from a snapshot).
struct SavePlan {
  int rank = 0;
  int world = 1;
  v1::StateDictType type = v1::FULL_STATE_DICT;
  bool writes = false;                     // FULL: rank 0 only
  std::vector<std::vector<Piece>> pieces;  // per unit
  struct FileSpec {
    std::string name;
    std::vector<SafetensorsSlot> slots;
    std::map<std::string, std::string> metadata;
  };
  FileSpec model, optim;
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

// FULL's gather of one unit's per-element values to the writer, shard-group
// rank 0 (global rank 0 in group 0), as the unpadded flat value; an unsharded
// unit's values are the value.
absl::Status GatherToWriter(Communicator& comm, bool sharded, int64_t numel,
                            std::span<const float> values, std::vector<float>& out) {
  if (!sharded) {
    out.assign(values.begin(), values.begin() + numel);
    return absl::OkStatus();
  }
  const bool receives = comm.rank() == 0;
  out.resize(receives ? values.size() * static_cast<size_t>(comm.size()) : 0);
  RETURN_IF_ERROR(comm.Gather(values.data(), receives ? out.data() : nullptr, values.size(),
                              DType::kFloat32, 0));
  if (receives) out.resize(static_cast<size_t>(numel));
  return absl::OkStatus();
}

// A synchronous save on the CPU device: the shards and optimizer state are
// host memory already and training is not running, so the writers read them
// where they are, with no copy (and no second copy of the state kept for the
// next save); FULL gathers over the host shard group.
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
  absl::Status Gather(size_t u, std::span<const float> values, std::vector<float>& out) override {
    const FlatParamUnit& unit = *runtime_.units()[u];
    return GatherToWriter(*runtime_.host_shard_comm(), unit.sharded(),
                          unit.layout().unpadded_unsharded_numel(), values, out);
  }

 private:
  explicit LiveHostSource(FsdpRuntime& runtime) : runtime_(runtime) {}
  FsdpRuntime& runtime_;
};

// An async save's source: copies of this rank's shards and optimizer state,
// gathered over the checkpoint communicator. Create() reads the pinned copies
// once they are complete.
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
  absl::Status Gather(size_t u, std::span<const float> values, std::vector<float>& out) override {
    const ShardSnapshot::Unit& unit = snapshot_.units[u];
    return GatherToWriter(*snapshot_.comm, unit.sharded, unit.numel, values, out);
  }

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
    for (const Piece& piece : plan.pieces[u]) {
      (piece.optim ? plan.optim : plan.model).slots.push_back(piece.slot);
    }
  }
  plan.writes = type != v1::FULL_STATE_DICT || plan.rank == 0;
  std::map<std::string, int64_t> model_offsets, optim_offsets;
  for (const std::vector<Piece>& pieces : plan.pieces) {
    for (const Piece& piece : pieces) {
      if (piece.element_offset < 0) continue;
      (piece.optim ? optim_offsets : model_offsets)[piece.slot.name] = piece.element_offset;
    }
  }
  std::map<std::string, std::string> metadata = {
      {"format", "flatshard"},
      {"state_dict_type", std::string(StateDictTypeName(type))},
      {"rank", absl::StrCat(plan.rank)},
      {"world_size", absl::StrCat(plan.world)}};
  if (type == v1::LOCAL_STATE_DICT) metadata["layout_digest"] = LocalLayoutDigest(runtime);
  const bool full = type == v1::FULL_STATE_DICT;
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

using PieceWrite = std::function<void(const Piece&, std::span<const float>)>;

// FULL: every rank gathers each unit's parameter and then each state, in
// torch's order, to the one writer. The writer's file writes run on a thread
// of their own, so writing one gathered value overlaps gathering the next (the
// gather is the slower half: Gloo moves (W-1)/W of the state into the writer
// at about the loopback's 1-1.5 GB/s). Two gathered buffers alternate, and one
// is gathered into again only once the writes from it are done: two gathered
// values are alive at a time on the writer, none on the others.
absl::Status StreamFullSave(SaveSource& source, const SavePlan& plan, const PieceWrite& write) {
  std::array<std::vector<float>, 2> gathered;
  std::mutex mu;
  std::condition_variable done;
  int64_t written = 0;  // writes finished, under mu
  int64_t posted = 0;
  std::array<int64_t, 2> last_write = {0, 0};  // the write that reads each buffer last
  // Declared after what its writes use, so it finishes them before that goes.
  std::optional<StreamThread> writer;
  if (plan.writes) writer.emplace();
  auto post = [&](std::function<void()> job) {
    writer->Post([&mu, &done, &written, job = std::move(job)] {
      job();
      {
        std::lock_guard<std::mutex> lock(mu);
        ++written;
      }
      done.notify_all();
      return absl::OkStatus();
    });
    return ++posted;
  };
  size_t next = 0;
  auto gather_and_write = [&](size_t u, std::span<const float> values, Piece::Source kind,
                              const std::string& state) -> absl::Status {
    std::vector<float>& buffer = gathered[next];
    {
      std::unique_lock<std::mutex> lock(mu);
      done.wait(lock, [&] { return written >= last_write[next]; });
    }
    RETURN_IF_ERROR(source.Gather(u, values, buffer));
    if (plan.writes) {
      last_write[next] = post([&write, &pieces = plan.pieces[u], &buffer, kind, state] {
        for (const Piece& piece : pieces) {
          if (piece.source != kind || piece.state != state) continue;
          write(piece, std::span<const float>(buffer).subspan(static_cast<size_t>(piece.flat_begin),
                                                              static_cast<size_t>(piece.count)));
        }
      });
    }
    next ^= 1;
    return absl::OkStatus();
  };
  for (size_t u = 0; u < plan.pieces.size(); ++u) {
    RETURN_IF_ERROR(gather_and_write(u, source.Shard(u), Piece::Source::kParam, ""));
    for (const std::string& state : source.StateNames(u)) {
      ASSIGN_OR_RETURN(std::span<const float> shard, source.State(u, state));
      RETURN_IF_ERROR(gather_and_write(u, shard, Piece::Source::kState, state));
    }
    if (!plan.writes) continue;
    post([&write, &pieces = plan.pieces[u], step = source.Step(u)] {
      for (const Piece& piece : pieces) {
        if (piece.source == Piece::Source::kStep) write(piece, std::span<const float>(&step, 1));
      }
    });
  }
  return absl::OkStatus();  // `writer` finishes the writes as it goes
}

// Runs the save's collectives unit by unit and hands every piece to the sinks
// (null when this rank writes nothing).
absl::Status StreamSave(SaveSource& source, const SavePlan& plan, TensorSink* model,
                        TensorSink* optim) {
  const PieceWrite write = [&](const Piece& piece, std::span<const float> values) {
    if (plan.writes) (piece.optim ? optim : model)->Append(piece.slot.name, values);
  };
  if (plan.type == v1::FULL_STATE_DICT) return StreamFullSave(source, plan, write);
  // SHARDED and LOCAL: this rank's own elements, straight from its shard and
  // states; no collective.
  for (size_t u = 0; u < plan.pieces.size(); ++u) {
    const float step = source.Step(u);
    for (const Piece& piece : plan.pieces[u]) {
      std::span<const float> values(&step, 1);
      if (piece.source == Piece::Source::kParam || piece.source == Piece::Source::kLocalFlat) {
        values = source.Shard(u);
      }
      if (piece.source == Piece::Source::kState || piece.source == Piece::Source::kLocalState) {
        ASSIGN_OR_RETURN(values, source.State(u, piece.state));
      }
      write(piece, values.subspan(static_cast<size_t>(piece.flat_begin),
                                  static_cast<size_t>(piece.count)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace {

ShardSaveResult FinishWriters(const std::vector<TolerantWriter*>& writers) {
  ShardSaveResult result;
  for (TolerantWriter* writer : writers) {
    absl::StatusOr<CheckpointFile> file = writer->Finish();
    if (!file.ok()) {
      if (result.write_status.ok()) result.write_status = file.status();
      continue;
    }
    result.files.push_back(*std::move(file));
  }
  return result;
}

// Streams `source` into this rank's files in `dir`.
absl::StatusOr<ShardSaveResult> WriteFiles(SaveSource& source, const SavePlan& plan,
                                           const std::string& dir, FileSystem* fs) {
  std::unique_ptr<TolerantWriter> model, optim;
  if (plan.writes) {
    model = std::make_unique<TolerantWriter>(absl::StrCat(dir, "/", plan.model.name),
                                             plan.model.slots, plan.model.metadata, plan.rank, fs);
    optim = std::make_unique<TolerantWriter>(absl::StrCat(dir, "/", plan.optim.name),
                                             plan.optim.slots, plan.optim.metadata, plan.rank, fs);
  }
  RETURN_IF_ERROR(StreamSave(source, plan, model.get(), optim.get()));
  if (!plan.writes) return ShardSaveResult{};
  return FinishWriters({model.get(), optim.get()});
}

}  // namespace

absl::StatusOr<ShardSaveResult> SaveShardCheckpoint(FsdpRuntime& runtime, const std::string& dir,
                                                    v1::StateDictType type) {
  ASSIGN_OR_RETURN(std::unique_ptr<LiveHostSource> live, LiveHostSource::Create(runtime));
  if (live != nullptr) {
    ASSIGN_OR_RETURN(SavePlan plan, PlanSave(runtime, type));
    return WriteFiles(*live, plan, dir, runtime.options().file_system);
  }
  // The shards live on the device: a save copies them (and the optimizer
  // state) to host memory first, then writes and gathers from the copies, over
  // the host shard group since training is not running meanwhile.
  ASSIGN_OR_RETURN(ShardSnapshot snapshot, SnapshotShardCheckpoint(runtime, type));
  snapshot.comm = runtime.host_shard_comm();
  return WriteShardSnapshot(snapshot, dir);
}

absl::StatusOr<ShardSnapshot> SnapshotShardCheckpoint(FsdpRuntime& runtime,
                                                      v1::StateDictType type) {
  ASSIGN_OR_RETURN(SavePlan plan, PlanSave(runtime, type));
  ShardSnapshot snapshot;
  snapshot.plan = std::make_shared<const SavePlan>(std::move(plan));
  snapshot.comm = runtime.checkpoint_comm();
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
      copy.numel = unit.layout().unpadded_unsharded_numel();
      copy.sharded = unit.sharded();
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
                                                   const std::string& dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<SnapshotSource> source, SnapshotSource::Create(snapshot));
  return WriteFiles(*source, *snapshot.plan, dir, snapshot.file_system);
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
