#include "worker/runtime/peer_snapshot.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <span>
#include <utility>

#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/optimizer.h"
#include "core/status_macros.h"
#include "worker/runtime/shard_checkpoint.h"

namespace flatshard {
namespace {

// Host byte order throughout: a snapshot never leaves the job's machines, and
// every rank of one job runs the same build.
constexpr uint64_t kMagic = 0x31504e5350534653ULL;  // "FSPSNPP1"
constexpr uint32_t kVersion = 1;

struct Header {
  uint64_t magic = kMagic;
  uint32_t version = kVersion;
  uint32_t units = 0;
  uint64_t epoch = 0;
  int64_t step = 0;
  int32_t rank = 0;
  int32_t world_size = 0;
  uint64_t payload_bytes = 0;
  uint64_t payload_xxh3 = 0;
};

// One piece of a parameter inside a shard (ShardParamInfo, in-shard only).
struct Piece {
  uint32_t param = 0;  // index in the unit's parameters
  int64_t intra_start = 0;
  int64_t count = 0;
  int64_t offset_in_shard = 0;
};

class ByteWriter {
 public:
  explicit ByteWriter(std::string& out) : out_(out) {}
  template <typename T>
  void Put(const T& value) {
    Append(&value, sizeof(T));
  }
  void Append(const void* data, size_t bytes) {
    out_.append(static_cast<const char*>(data), bytes);
  }

 private:
  std::string& out_;
};

class ByteReader {
 public:
  explicit ByteReader(std::string_view bytes) : bytes_(bytes) {}
  template <typename T>
  bool Get(T& value) {
    if (bytes_.size() - pos_ < sizeof(T)) return false;
    std::memcpy(&value, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return true;
  }
  // The next `bytes` bytes, or nullptr when the input is shorter.
  const char* Take(size_t bytes) {
    if (bytes_.size() - pos_ < bytes) return nullptr;
    const char* at = bytes_.data() + pos_;
    pos_ += bytes;
    return at;
  }

 private:
  std::string_view bytes_;
  size_t pos_ = 0;
};

absl::Status Damaged(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("peer snapshot is damaged: ", what));
}

// One unit of a parsed snapshot: views into the bytes.
struct UnitView {
  int64_t shard_numel = 0;
  float step = 0;
  std::vector<std::string> state_names;
  std::vector<Piece> pieces;
  const char* shard = nullptr;      // shard_numel floats
  std::vector<const char*> states;  // per state name, shard_numel floats
};

absl::StatusOr<UnitView> ReadUnit(ByteReader& in, int u) {
  UnitView view;
  uint32_t states = 0, pieces = 0;
  if (!in.Get(view.shard_numel) || !in.Get(view.step) || !in.Get(states) || !in.Get(pieces) ||
      view.shard_numel < 0 || states > 16) {
    return Damaged(absl::StrCat("unit ", u, " has a bad header"));
  }
  for (uint32_t s = 0; s < states; ++s) {
    uint32_t length = 0;
    const char* name = nullptr;
    if (!in.Get(length) || length > 256 || (name = in.Take(length)) == nullptr) {
      return Damaged(absl::StrCat("unit ", u, " has a bad state name"));
    }
    view.state_names.emplace_back(name, length);
  }
  view.pieces.resize(pieces);
  for (Piece& p : view.pieces) {
    if (!in.Get(p.param) || !in.Get(p.intra_start) || !in.Get(p.count) ||
        !in.Get(p.offset_in_shard) || p.intra_start < 0 || p.count < 0 || p.offset_in_shard < 0 ||
        p.offset_in_shard + p.count > view.shard_numel) {
      return Damaged(absl::StrCat("unit ", u, " has a bad parameter piece"));
    }
  }
  const auto bytes = static_cast<size_t>(view.shard_numel) * sizeof(float);
  if ((view.shard = in.Take(bytes)) == nullptr) {
    return Damaged(absl::StrCat("unit ", u, " is cut short"));
  }
  for (uint32_t s = 0; s < states; ++s) {
    const char* values = in.Take(bytes);
    if (values == nullptr) return Damaged(absl::StrCat("unit ", u, " is cut short"));
    view.states.push_back(values);
  }
  return view;
}

// The rebuilt state of this rank, and which of its shard elements are filled.
struct Rebuild {
  StagedCheckpoint staged;
  std::vector<std::vector<bool>> filled;  // per unit, S
  bool have_states = false;
};

void CopyFloats(const char* from, int64_t from_index, std::span<float> to, int64_t to_index,
                int64_t count) {
  std::memcpy(to.data() + to_index, from + static_cast<size_t>(from_index) * sizeof(float),
              static_cast<size_t>(count) * sizeof(float));
}

// Staging memory for `count` floats, zeroed: the pieces may leave padding
// unwritten, and the blocks are reused.
absl::StatusOr<StagedFloats> ZeroedFloats(const FsdpRuntime& runtime, size_t count) {
  ASSIGN_OR_RETURN(StagedFloats staged, StagedFloats::Allocate(runtime.device(), count));
  std::fill(staged.values().begin(), staged.values().end(), 0.0f);
  return staged;
}

// Takes the elements of this rank's shards that old rank `info.rank`'s
// snapshot holds.
absl::Status Merge(const FsdpRuntime& runtime, std::string_view bytes, Rebuild& rebuild) {
  ByteReader in(bytes);
  Header header;
  (void)in.Get(header);  // ReadPeerSnapshotInfo checked it
  for (size_t u = 0; u < runtime.units().size(); ++u) {
    ASSIGN_OR_RETURN(UnitView view, ReadUnit(in, static_cast<int>(u)));
    const FlatParamUnit& unit = *runtime.units()[u];
    const FlatParamLayout& layout = unit.layout();
    const int64_t shard_start = layout.ComputeShardInfo(unit.config().shard_rank).range.start;
    const int64_t shard_numel = layout.sharded_numel();
    std::map<std::string, StagedFloats>& states = rebuild.staged.states[u];
    if (!rebuild.have_states) {
      for (const std::string& name : view.state_names) {
        ASSIGN_OR_RETURN(states[name], ZeroedFloats(runtime, static_cast<size_t>(shard_numel)));
      }
    } else if (view.state_names.size() != states.size() ||
               !std::all_of(view.state_names.begin(), view.state_names.end(),
                            [&](const std::string& n) { return states.contains(n); })) {
      return absl::FailedPreconditionError(absl::StrCat("the peer snapshots disagree on unit ", u,
                                                        "'s optimizer state (",
                                                        absl::StrJoin(view.state_names, ","), ")"));
    }
    rebuild.staged.steps[u] = view.step;
    for (const Piece& piece : view.pieces) {
      if (piece.param >= layout.param_ranges().size()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "a peer snapshot names parameter ", piece.param, " of unit ", u, ", which has ",
            layout.param_ranges().size(), ": it was taken of another model"));
      }
      const FlatRange& range = layout.param_ranges()[piece.param];
      if (piece.intra_start + piece.count > range.numel()) {
        return absl::FailedPreconditionError(
            absl::StrCat("a peer snapshot holds elements past the end of parameter ", piece.param,
                         " of unit ", u, ": it was taken of another model"));
      }
      // Where the piece lands in this layout, clipped to this rank's shard.
      const int64_t flat = range.start + piece.intra_start;
      const int64_t lo = std::max(flat, shard_start);
      const int64_t hi = std::min(flat + piece.count, shard_start + shard_numel);
      if (lo >= hi) continue;
      const int64_t from = piece.offset_in_shard + (lo - flat);
      const int64_t to = lo - shard_start;
      CopyFloats(view.shard, from, rebuild.staged.shards[u].values(), to, hi - lo);
      for (size_t s = 0; s < view.state_names.size(); ++s) {
        CopyFloats(view.states[s], from, states[view.state_names[s]].values(), to, hi - lo);
      }
      std::fill_n(rebuild.filled[u].begin() + to, hi - lo, true);
    }
  }
  rebuild.have_states = true;
  return absl::OkStatus();
}

// OK when every parameter element of this rank's shards was rebuilt.
absl::Status CheckFilled(const FsdpRuntime& runtime, const Rebuild& rebuild) {
  for (size_t u = 0; u < runtime.units().size(); ++u) {
    const FlatParamUnit& unit = *runtime.units()[u];
    const ShardInfo mine = unit.layout().ComputeShardInfo(unit.config().shard_rank);
    for (size_t p = 0; p < mine.params.size(); ++p) {
      const ShardParamInfo& param = mine.params[p];
      if (!param.in_shard) continue;
      const auto begin = rebuild.filled[u].begin() + param.offset_in_shard;
      if (!std::all_of(begin, begin + param.numel_in_shard, [](bool f) { return f; })) {
        return absl::FailedPreconditionError(
            absl::StrCat("the peer snapshots do not cover parameter ", p, " of unit ", u));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> CapturePeerSnapshot(FsdpRuntime& runtime, uint64_t epoch,
                                                int64_t step) {
  RETURN_IF_ERROR(runtime.SynchronizeStreams());
  // The header goes in front once the payload's length and checksum are
  // known; its room is kept so the payload is written once, in place.
  std::string payload(sizeof(Header), '\0');
  ByteWriter out(payload);
  for (size_t u = 0; u < runtime.units().size(); ++u) {
    runtime.NoteProgress();  // a unit's copy is work: the stall detector's counter
    const FlatParamUnit& unit = *runtime.units()[u];
    ASSIGN_OR_RETURN(std::vector<float> shard, unit.ReadShard());
    ASSIGN_OR_RETURN(std::unique_ptr<OptimizerState> optim, runtime.ReadOptimizerState(u));
    const std::vector<std::string> names = optim->StateNames();
    const ShardInfo info = unit.layout().ComputeShardInfo(unit.config().shard_rank);
    std::vector<Piece> pieces;
    for (size_t p = 0; p < info.params.size(); ++p) {
      const ShardParamInfo& param = info.params[p];
      if (!param.in_shard) continue;
      pieces.push_back(Piece{static_cast<uint32_t>(p), param.intra_param_start_idx,
                             param.numel_in_shard, param.offset_in_shard});
    }
    const auto numel = static_cast<int64_t>(shard.size());
    const size_t values = static_cast<size_t>(numel) * sizeof(float);
    payload.reserve(payload.size() + values * (1 + names.size()) + 64 * (1 + pieces.size()));
    out.Put(numel);
    out.Put(static_cast<float>(optim->step()));
    out.Put(static_cast<uint32_t>(names.size()));
    out.Put(static_cast<uint32_t>(pieces.size()));
    for (const std::string& name : names) {
      out.Put(static_cast<uint32_t>(name.size()));
      out.Append(name.data(), name.size());
    }
    for (const Piece& piece : pieces) {
      out.Put(piece.param);
      out.Put(piece.intra_start);
      out.Put(piece.count);
      out.Put(piece.offset_in_shard);
    }
    out.Append(shard.data(), values);
    for (const std::string& name : names) {
      ASSIGN_OR_RETURN(std::span<const float> state, optim->State(name));
      if (state.size() != shard.size()) {
        return absl::InternalError(absl::StrCat("unit ", u, "'s optimizer state '", name, "' has ",
                                                state.size(), " elements, its shard ",
                                                shard.size()));
      }
      out.Append(state.data(), values);
    }
  }
  Header header;
  header.units = static_cast<uint32_t>(runtime.units().size());
  header.epoch = epoch;
  header.step = step;
  header.rank = runtime.rank();
  header.world_size = runtime.world_size();
  header.payload_bytes = payload.size() - sizeof(Header);
  header.payload_xxh3 = XXH3_64bits(payload.data() + sizeof(Header), header.payload_bytes);
  std::memcpy(payload.data(), &header, sizeof(Header));
  return payload;
}

absl::StatusOr<PeerSnapshotInfo> ReadPeerSnapshotInfo(std::string_view bytes) {
  ByteReader in(bytes);
  Header header;
  if (!in.Get(header) || header.magic != kMagic) return Damaged("no snapshot header");
  if (header.version != kVersion) {
    return Damaged(absl::StrCat("version ", header.version, ", this build reads ", kVersion));
  }
  if (bytes.size() - sizeof(Header) != header.payload_bytes) {
    return Damaged(absl::StrCat(bytes.size() - sizeof(Header), " payload bytes, the header says ",
                                header.payload_bytes));
  }
  if (XXH3_64bits(bytes.data() + sizeof(Header), header.payload_bytes) != header.payload_xxh3) {
    return Damaged("checksum mismatch");
  }
  return PeerSnapshotInfo{header.epoch, header.step, header.rank, header.world_size,
                          static_cast<int>(header.units)};
}

absl::StatusOr<PeerRestoreOutcome> RestoreFromPeerSnapshots(
    FsdpRuntime& runtime, const PeerRestoreRequest& request,
    const std::function<std::shared_ptr<const std::string>(int old_rank)>& find) {
  Communicator* world = runtime.host_world_comm();
  if (request.from_world_size < 1 ||
      request.holder.size() != static_cast<size_t>(request.from_world_size)) {
    return absl::InvalidArgumentError(
        absl::StrCat("restore_peer_snapshot: holder names ", request.holder.size(),
                     " ranks for a world of size ", request.from_world_size));
  }
  for (int h : request.holder) {
    if (h < 0 || h >= world->size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "restore_peer_snapshot: holder rank ", h, " is outside a world of size ", world->size()));
    }
  }
  Rebuild rebuild;
  const size_t units = runtime.units().size();
  rebuild.staged.shards.resize(units);
  rebuild.staged.states.resize(units);
  rebuild.staged.steps.resize(units);
  rebuild.filled.resize(units);
  PeerRestoreOutcome outcome;
  absl::Status& data = outcome.data_status;
  for (size_t u = 0; u < units && data.ok(); ++u) {
    const auto numel = static_cast<size_t>(runtime.units()[u]->layout().sharded_numel());
    absl::StatusOr<StagedFloats> shard = ZeroedFloats(runtime, numel);
    if (!shard.ok()) {
      data = shard.status();  // still through every broadcast below
      break;
    }
    rebuild.staged.shards[u] = *std::move(shard);
    rebuild.filled[u].assign(numel, false);
  }
  // Every rank goes through every broadcast whatever it found, so the
  // collectives stay matched; the first data problem is the outcome.
  for (int k = 0; k < request.from_world_size; ++k) {
    const int root = request.holder[static_cast<size_t>(k)];
    std::shared_ptr<const std::string> held;
    if (root == runtime.rank()) held = find(k);
    int64_t size = held != nullptr ? static_cast<int64_t>(held->size()) : 0;
    RETURN_IF_ERROR(world->Broadcast(&size, 1, DType::kInt64, root));
    if (size <= 0) {
      if (data.ok()) {
        data = absl::NotFoundError(absl::StrCat("rank ", root, " no longer holds old rank ", k,
                                                "'s snapshot of step ", request.step));
      }
      continue;
    }
    // Whole int64 words: the broadcast moves elements of a dtype.
    std::vector<int64_t> buffer((static_cast<size_t>(size) + 7) / 8, 0);
    if (held != nullptr) std::memcpy(buffer.data(), held->data(), held->size());
    RETURN_IF_ERROR(world->Broadcast(buffer.data(), buffer.size(), DType::kInt64, root));
    outcome.bytes_received += size;
    if (!data.ok()) continue;
    const std::string_view bytes(reinterpret_cast<const char*>(buffer.data()),
                                 static_cast<size_t>(size));
    absl::StatusOr<PeerSnapshotInfo> info = ReadPeerSnapshotInfo(bytes);
    if (!info.ok()) {
      data = info.status();
    } else if (info->epoch != request.from_epoch || info->step != request.step || info->rank != k ||
               info->world_size != request.from_world_size ||
               info->units != static_cast<int>(units)) {
      data = absl::FailedPreconditionError(
          absl::StrCat("rank ", root, " sent the snapshot of epoch ", info->epoch, " step ",
                       info->step, " rank ", info->rank, " of ", info->world_size, " (",
                       info->units, " units) for epoch ", request.from_epoch, " step ",
                       request.step, " rank ", k, " of ", request.from_world_size));
    } else {
      data = Merge(runtime, bytes, rebuild);
    }
  }
  if (data.ok()) data = CheckFilled(runtime, rebuild);
  // All or none: a rank that could not rebuild its shards keeps every rank's
  // state as it was.
  float failed = data.ok() ? 0.0f : 1.0f;
  RETURN_IF_ERROR(world->AllReduce(&failed, 1, DType::kFloat32, ReduceOp::kMax));
  if (failed > 0 && data.ok()) {
    data = absl::FailedPreconditionError("another rank could not rebuild its shards");
  }
  if (!data.ok()) return outcome;
  RETURN_IF_ERROR(ApplyStagedCheckpoint(runtime, std::move(rebuild.staged)));
  return outcome;
}

}  // namespace flatshard
