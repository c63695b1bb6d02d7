// Loading one rank's part of a checkpoint (docs/architecture.md §6): staging
// reads and validates everything first, changing nothing; applying replaces
// the shards and the optimizer state. The save side is shard_checkpoint.cc.
#include <algorithm>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/model_spec.h"
#include "core/status_macros.h"
#include "storage/checkpoint_reader.h"
#include "worker/runtime/shard_checkpoint.h"

namespace flatshard {

namespace {

// Asked between units: a load reads without collectives, so nothing else in
// it would notice an abort (worker/service/abort_watchdog.h counts on it).
absl::Status CheckNotAborted(FsdpRuntime& runtime, size_t unit) {
  runtime.NoteProgress();
  if (!runtime.aborted()) return absl::OkStatus();
  return absl::AbortedError(
      absl::StrCat("the load was aborted after ", unit, " of ", runtime.units().size(), " units"));
}

absl::Status StageLocal(FsdpRuntime& runtime, CheckpointReader& reader, StagedCheckpoint& staged) {
  const CheckpointManifest& m = reader.manifest();
  const int rank = runtime.rank();
  auto refuse = [&](absl::string_view why) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", reader.dir(), " is a LOCAL_STATE_DICT saved at world size ", m.world_size,
        " (", m.strategy, "), ", why,
        ". LOCAL state dicts hold flat shards tied to one layout and world size: load a "
        "SHARDED or FULL checkpoint instead, or convert this one offline with `flatshard ckpt "
        "consolidate`"));
  };
  if (m.world_size != runtime.world_size()) {
    return refuse(absl::StrCat("this job has world size ", runtime.world_size()));
  }
  ASSIGN_OR_RETURN(SafetensorsReader * model,
                   reader.File(RankFileName("model", rank, m.world_size)));
  ASSIGN_OR_RETURN(SafetensorsReader * optim,
                   reader.File(RankFileName("optim", rank, m.world_size)));
  auto digest = model->header().metadata.find("layout_digest");
  if (digest == model->header().metadata.end() || digest->second != LocalLayoutDigest(runtime)) {
    return refuse(
        "and this job's flat layout differs (another wrap policy, model, strategy "
        "or alignment)");
  }
  // Each tensor into a staged buffer of the shard's size, read at FinishShare
  // (the buffers live in `staged` until then); the tail past the tensor's
  // elements is zeroed, the buffer being reused memory.
  auto read_padded = [&](const SafetensorsReader& file, const std::string& file_name,
                         const std::string& name, uint64_t s, StagedFloats& out) -> absl::Status {
    ASSIGN_OR_RETURN(const SafetensorsEntry* entry, file.Find(name));
    if (entry->numel() > s) {
      return absl::InvalidArgumentError(absl::StrCat(file.path(), ": '", name, "' holds ",
                                                     entry->numel(),
                                                     " elements, more than the shard's ", s));
    }
    ASSIGN_OR_RETURN(out, StagedFloats::Allocate(runtime.device(), s));
    const std::span<float> tensor = out.values().first(entry->numel());
    std::fill(out.values().begin() + static_cast<std::ptrdiff_t>(tensor.size()), out.values().end(),
              0.0f);
    return reader.ReadTensorDeferred(file_name, name, 0, tensor);
  };
  const std::string model_file = RankFileName("model", rank, m.world_size);
  const std::string optim_file = RankFileName("optim", rank, m.world_size);
  for (size_t u = 0; u < runtime.units().size(); ++u) {
    RETURN_IF_ERROR(CheckNotAborted(runtime, u));
    const FlatParamUnit& unit = *runtime.units()[u];
    const auto s = static_cast<uint64_t>(unit.layout().sharded_numel());
    const std::string flat = LocalFlatTensorName(unit.config().unit);
    RETURN_IF_ERROR(read_padded(*model, model_file, flat, s, staged.shards[u]));
    for (const std::string& state : m.optimizer_states) {
      const std::string name = absl::StrCat(flat, ".", state);
      if (!optim->Find(name).ok()) continue;
      RETURN_IF_ERROR(read_padded(*optim, optim_file, name, s, staged.states[u][state]));
    }
    const std::string step = absl::StrCat(flat, ".step");
    if (optim->Find(step).ok()) {
      ASSIGN_OR_RETURN(std::vector<float> value, optim->ReadFloats(step, 0, 1));
      staged.steps[u] = value[0];
    }
  }
  return absl::OkStatus();
}

absl::Status CheckSameParams(const FsdpRuntime& runtime, const CheckpointReader& reader) {
  const CheckpointManifest& m = reader.manifest();
  std::vector<std::string> missing, mismatched;
  std::set<std::string> ours;
  for (const auto& unit : runtime.units()) {
    for (const UnitParam& p : unit->config().unit.params) {
      ours.insert(p.fqn);
      auto it = m.params.find(p.fqn);
      if (it == m.params.end()) {
        missing.push_back(p.fqn);
      } else if (it->second.shape != p.shape) {
        mismatched.push_back(absl::StrCat(p.fqn, " [", absl::StrJoin(it->second.shape, ", "),
                                          "] vs [", absl::StrJoin(p.shape, ", "), "]"));
      }
    }
  }
  std::vector<std::string> unexpected;
  for (const auto& [fqn, info] : m.params) {
    if (!ours.contains(fqn)) unexpected.push_back(fqn);
  }
  if (missing.empty() && unexpected.empty() && mismatched.empty()) return absl::OkStatus();
  std::string why;
  if (!missing.empty()) absl::StrAppend(&why, "; missing ", absl::StrJoin(missing, ", "));
  if (!unexpected.empty()) absl::StrAppend(&why, "; unexpected ", absl::StrJoin(unexpected, ", "));
  if (!mismatched.empty()) {
    absl::StrAppend(&why, "; shape differs for ", absl::StrJoin(mismatched, ", "));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("checkpoint ", reader.dir(), " does not fit this model", why));
}

// Fills `shard` (S elements, this rank's piece of the flat layout) from full
// tensors in the checkpoint, reading only the elements the shard covers
// (docs/fsdp-semantics.md §6.4's flatten-and-shard, without materialising the flat value).
// Every element is written, the staged memory being reused: a parameter's
// elements are read, alignment padding inside the flat holds `padding` (42 for
// parameters as FlattenParams does, 0 for optimizer state), and the shard's
// right padding 0. A parameter `name_of` names "" for, or (with `any_found`)
// one the checkpoint has no such tensor of, reads as zeros; without
// `any_found` NOT_FOUND propagates.
absl::Status ReadShard(CheckpointReader& reader, absl::string_view kind, const FlatParamUnit& unit,
                       const std::function<std::string(const UnitParam&)>& name_of, float padding,
                       std::span<float> shard, bool* any_found) {
  const FlatParamLayout& layout = unit.layout();
  const Unit& spec = unit.config().unit;
  const int64_t s = layout.sharded_numel();
  if (shard.size() != static_cast<size_t>(s)) {
    return absl::InternalError(absl::StrCat("a staged shard of ", shard.size(),
                                            " elements for a layout sharded into ", s));
  }
  const int64_t shard_begin = unit.sharded() ? s * unit.config().shard_rank : 0;
  const int64_t shard_end = shard_begin + s;
  // [lo, hi) of the flat, clipped to the shard, as a part of `shard`.
  auto part = [&](int64_t lo, int64_t hi) {
    lo = std::max(lo, shard_begin);
    hi = std::min(hi, shard_end);
    return lo < hi
               ? shard.subspan(static_cast<size_t>(lo - shard_begin), static_cast<size_t>(hi - lo))
               : std::span<float>();
  };
  // The entries in flat order (docs/fsdp-semantics.md §1.2: each parameter or
  // padding), so every element of the shard is met once.
  int64_t offset = 0;
  size_t param = 0;
  for (size_t e = 0; e < layout.numels_with_padding().size(); ++e) {
    const int64_t start = offset;
    offset += layout.numels_with_padding()[e];
    const std::span<float> into = part(start, offset);
    if (layout.is_padding_mask()[e]) {
      std::fill(into.begin(), into.end(), padding);
      continue;
    }
    if (param == spec.params.size()) break;  // refused below
    const UnitParam& p = spec.params[param++];
    if (into.empty()) continue;
    const std::string name = name_of(p);
    if (name.empty()) {
      std::fill(into.begin(), into.end(), 0.0f);
      continue;
    }
    // Straight into the staged shard, at FinishShare.
    const uint64_t intra = static_cast<uint64_t>(std::max(start, shard_begin) - start);
    const absl::Status read = reader.ReadRangeDeferred(kind, name, p.shape, intra, into);
    if (absl::IsNotFound(read) && any_found != nullptr) {
      std::fill(into.begin(), into.end(), 0.0f);  // no state: zeros
      continue;
    }
    RETURN_IF_ERROR(read);
    if (any_found != nullptr) *any_found = true;
  }
  const auto listed = static_cast<size_t>(
      std::count(layout.is_padding_mask().begin(), layout.is_padding_mask().end(), false));
  if (listed != spec.params.size()) {
    return absl::InternalError(absl::StrCat("the flat layout lists ", listed, " parameters, unit ",
                                            spec.module_fqn, " ", spec.params.size()));
  }
  const std::span<float> right = part(offset, shard_end);
  std::fill(right.begin(), right.end(), 0.0f);
  return absl::OkStatus();
}

// Whether the checkpoint holds optimizer state `state` for any trainable
// parameter of the unit, wherever its elements lie. Decided per unit, not by
// what this rank's shard holds: a rank whose shard has only frozen elements
// or padding keeps the state (zeros) as every other rank does, as training
// would have left it, so that its next save lists the unit's states and step
// as theirs do (a zero-length read finds the tensor or says NOT_FOUND).
absl::StatusOr<bool> UnitHoldsState(CheckpointReader& reader, const Unit& spec,
                                    const std::string& state) {
  for (const UnitParam& p : spec.params) {
    if (!p.requires_grad) continue;
    const absl::Status probe =
        reader.ReadRangeInto("optim", absl::StrCat(p.fqn, ".", state), p.shape, 0, {});
    if (absl::IsNotFound(probe)) continue;
    RETURN_IF_ERROR(probe);
    return true;
  }
  return false;
}

absl::Status StageTensors(FsdpRuntime& runtime, CheckpointReader& reader,
                          StagedCheckpoint& staged) {
  RETURN_IF_ERROR(CheckSameParams(runtime, reader));
  const CheckpointManifest& m = reader.manifest();
  for (size_t u = 0; u < runtime.units().size(); ++u) {
    RETURN_IF_ERROR(CheckNotAborted(runtime, u));
    const FlatParamUnit& unit = *runtime.units()[u];
    const Unit& spec = unit.config().unit;
    const auto s = static_cast<size_t>(unit.layout().sharded_numel());
    ASSIGN_OR_RETURN(staged.shards[u], StagedFloats::Allocate(runtime.device(), s));
    RETURN_IF_ERROR(ReadShard(
        reader, "model", unit, [](const UnitParam& p) { return p.fqn; },
        static_cast<float>(kFlatParamPaddingValue), staged.shards[u].values(), nullptr));
    for (const std::string& state : m.optimizer_states) {
      // Staged once: a second buffer would free the first with its reads
      // still waiting for FinishShare (ParseManifest refuses such a list).
      if (staged.states[u].contains(state)) continue;
      // A parameter without the state reads as zeros, which is what torch's
      // Adam and SGD momentum start from (docs/fsdp-semantics.md §6.4: zeros = no state).
      bool any = false;
      ASSIGN_OR_RETURN(StagedFloats values, StagedFloats::Allocate(runtime.device(), s));
      RETURN_IF_ERROR(ReadShard(
          reader, "optim", unit,
          [&](const UnitParam& p) {
            return p.requires_grad ? absl::StrCat(p.fqn, ".", state) : std::string();
          },
          0.0f, values.values(), &any));
      if (!any) {
        ASSIGN_OR_RETURN(any, UnitHoldsState(reader, spec, state));
      }
      if (any) staged.states[u][state] = std::move(values);
    }
    for (const UnitParam& p : spec.params) {
      absl::StatusOr<std::vector<float>> step =
          reader.ReadFull("optim", absl::StrCat(p.fqn, ".step"), {});
      if (absl::IsNotFound(step.status())) continue;
      if (!step.ok()) return step.status();
      staged.steps[u] = (*step)[0];
      break;
    }
    // Every save writes a unit's step with its states: states without one
    // would restart the bias corrections at step 0 while the moments go on.
    if (!staged.states[u].empty() && !staged.steps[u].has_value()) {
      return absl::DataLossError(absl::StrCat(reader.dir(), ": unit ", spec.module_fqn,
                                              " has optimizer state but no '<fqn>.step' in the "
                                              "optimizer files"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<StagedCheckpoint> StageShardCheckpoint(FsdpRuntime& runtime,
                                                      const std::string& dir) {
  RETURN_IF_ERROR(CheckNotAborted(runtime, 0));
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  const CheckpointManifest& m = reader->manifest();
  const std::string ours(OptimizerKindName(runtime.options().optimizer.kind));
  if (!m.optimizer_states.empty() && m.optimizer != ours) {
    return absl::FailedPreconditionError(
        absl::StrCat("checkpoint ", dir, " holds ", m.optimizer, " optimizer state (",
                     absl::StrJoin(m.optimizer_states, ", "), "); this job's optimizer is ", ours));
  }
  StagedCheckpoint staged;
  staged.manifest = m;
  const size_t units = runtime.units().size();
  staged.shards.resize(units);
  staged.states.resize(units);
  staged.steps.resize(units);
  // The hashing is shared out: each rank hashes the files or regions it is
  // the verifier of and checks every file's size and header. A damaged file fails its
  // verifier's stage, so the load is refused whole (no rank applies), even
  // where no rank would have read the damage, and the checkpoint's bytes are
  // hashed once, not once per rank. The reads from a rank's own share (at the
  // saving world size, all it reads) wait for FinishShare, which hashes the
  // bytes as they land: read from the disk once, not once to hash and again.
  // Asked before each MiB read or hashed: each counts as progress.
  const std::function<bool()> aborted = [&runtime] {
    runtime.NoteProgress();
    return runtime.aborted();
  };
  RETURN_IF_ERROR(reader->BeginShare(runtime.rank(), runtime.world_size(), aborted));
  const absl::Status read = m.state_dict_type == v1::LOCAL_STATE_DICT
                                ? StageLocal(runtime, *reader, staged)
                                : StageTensors(runtime, *reader, staged);
  // Damage is reported before what staging made of it; a failed staging's
  // buffers are not written.
  RETURN_IF_ERROR(reader->FinishShare(/*deliver=*/read.ok(), aborted));
  RETURN_IF_ERROR(read);
  return staged;
}

absl::Status ApplyStagedCheckpoint(FsdpRuntime& runtime, StagedCheckpoint staged) {
  StepProgram reshard;
  for (size_t u = 0; u < runtime.units().size(); ++u) {
    reshard.push_back(StepCommand::Reshard(static_cast<int>(u)));
  }
  RETURN_IF_ERROR(runtime.RunControl(reshard));
  RETURN_IF_ERROR(runtime.SynchronizeStreams());
  for (size_t u = 0; u < runtime.units().size(); ++u) {
    runtime.NoteProgress();  // a unit's copy is work: the stall detector's counter
    FlatParamUnit& unit = *runtime.units()[u];
    const auto size = static_cast<size_t>(unit.layout().sharded_numel());
    if (staged.shards[u].values().size() != size) {
      return absl::InternalError(absl::StrCat("staged shard of unit ", u, " has ",
                                              staged.shards[u].values().size(), " elements, not ",
                                              size));
    }
    // The staged values become the shard and the state (on the CPU device the
    // blocks themselves; elsewhere copied in place).
    RETURN_IF_ERROR(unit.ReplaceShard(std::move(staged.shards[u])));
    RETURN_IF_ERROR(runtime.WriteOptimizerState(u, std::move(staged.states[u]),
                                                staged.steps[u].value_or(0.0f)));
  }
  return absl::OkStatus();
}

}  // namespace flatshard
