#include "worker/runtime/save_pieces.h"

#include <algorithm>
#include <map>

#include "absl/strings/str_cat.h"

#include "core/sharded_tensor_pieces.h"
#include "worker/runtime/shard_checkpoint.h"

namespace flatshard {
namespace {

// FULL and SHARDED: "<fqn>.step" of every trained parameter, whole (0-dim),
// when the optimizer keeps state.
void AppendStepPieces(const Unit& spec, const std::vector<std::string>& states,
                      std::vector<Piece>& pieces) {
  if (states.empty()) return;
  for (const UnitParam& p : spec.params) {
    if (!p.requires_grad) continue;
    pieces.push_back({{absl::StrCat(p.fqn, ".step"), DType::kFloat32, {}},
                      true,
                      Piece::Source::kStep,
                      "",
                      0,
                      1});
  }
}

// The SHARDED pieces of `unit` this rank writes, in file order: for every
// parameter (then every state of those that train), the elements its flat
// shard holds, read straight from the shard. Under HYBRID_SHARD the R
// replicas of a shard hold the same elements, so replica k writes the k-th of
// R even parts of the shard's range: every element is written once and no
// rank exchanges anything.
std::vector<Piece> ShardedPieces(const FlatParamUnit& unit, const std::vector<std::string>& states,
                                 int rank, int world) {
  const FlatParamLayout& layout = unit.layout();
  const Unit& spec = unit.config().unit;
  const WrittenRange written = RangeWrittenBy(unit, rank, world);
  const int64_t shard_begin = written.shard_begin, begin = written.begin, end = written.end;
  std::vector<Piece> pieces;
  auto add = [&](size_t i, bool optim, Piece::Source source, const std::string& state) {
    const FlatRange& range = layout.param_ranges()[i];
    const int64_t from = std::max(begin, range.start), to = std::min(end, range.end + 1);
    if (to <= from) return;
    const std::string name =
        state.empty() ? spec.params[i].fqn : absl::StrCat(spec.params[i].fqn, ".", state);
    pieces.push_back({{name, optim ? DType::kFloat32 : spec.params[i].dtype, {to - from}},
                      optim,
                      source,
                      state,
                      from - shard_begin,
                      to - from,
                      from - range.start});
  };
  for (size_t i = 0; i < spec.params.size(); ++i) add(i, false, Piece::Source::kParam, "");
  for (const std::string& s : states) {
    for (size_t i = 0; i < spec.params.size(); ++i) {
      if (spec.params[i].requires_grad) add(i, true, Piece::Source::kState, s);
    }
  }
  AppendStepPieces(spec, states, pieces);
  return pieces;
}

}  // namespace

WrittenRange RangeWrittenBy(const FlatParamUnit& unit, int rank, int world) {
  const FlatParamLayout& layout = unit.layout();
  const int64_t n = layout.unpadded_unsharded_numel();
  // A unit that is not sharded: every rank holds all of it.
  int64_t shard_begin = 0, replicas = world, replica = rank, held = n;
  if (unit.sharded()) {
    const int shard_rank = unit.config().shard_rank;
    const int group = layout.world_size();
    replicas = world / group;
    replica = (rank - shard_rank) / group;
    shard_begin = static_cast<int64_t>(shard_rank) * layout.sharded_numel();
    held = layout.sharded_numel();
  }
  const int64_t lo = std::min(shard_begin, n), hi = std::min(shard_begin + held, n);
  return {shard_begin, lo + (hi - lo) * replica / replicas,
          lo + (hi - lo) * (replica + 1) / replicas};
}

std::vector<Piece> UnitPieces(const FlatParamUnit& unit, const std::vector<std::string>& states,
                              v1::StateDictType type, int rank, int world) {
  if (type == v1::SHARDED_STATE_DICT) return ShardedPieces(unit, states, rank, world);
  std::vector<Piece> pieces;
  const Unit& spec = unit.config().unit;
  if (type == v1::LOCAL_STATE_DICT) {
    const ShardInfo info = unit.layout().ComputeShardInfo(unit.config().shard_rank);
    const int64_t valid = unit.layout().sharded_numel() - info.numel_padded;
    const std::string flat = LocalFlatTensorName(spec);
    pieces.push_back(
        {{flat, DType::kFloat32, {valid}}, false, Piece::Source::kLocalFlat, "", 0, valid});
    for (const std::string& s : states) {
      pieces.push_back({{absl::StrCat(flat, ".", s), DType::kFloat32, {valid}},
                        true,
                        Piece::Source::kLocalState,
                        s,
                        0,
                        valid});
    }
    if (!states.empty()) {
      pieces.push_back({{absl::StrCat(flat, ".step"), DType::kFloat32, {}},
                        true,
                        Piece::Source::kStep,
                        "",
                        0,
                        1});
    }
    return pieces;
  }
  // FULL: every parameter and state whole, at its place in the flat value.
  std::map<std::string, size_t> index_of;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    index_of[spec.params[i].fqn] = i;
    pieces.push_back({{spec.params[i].fqn, spec.params[i].dtype, spec.params[i].shape},
                      false,
                      Piece::Source::kParam,
                      "",
                      unit.layout().param_ranges()[i].start,
                      spec.params[i].numel});
  }
  for (const SharedParam& shared : spec.shared) {  // tied aliases, as torch's state_dict lists them
    const size_t i = index_of.at(shared.primary_fqn);
    pieces.push_back({{shared.fqn, spec.params[i].dtype, spec.params[i].shape},
                      false,
                      Piece::Source::kParam,
                      "",
                      unit.layout().param_ranges()[i].start,
                      spec.params[i].numel});
  }
  for (const std::string& s : states) {
    for (size_t i = 0; i < spec.params.size(); ++i) {
      if (!spec.params[i].requires_grad) continue;  // torch keeps no state for them
      pieces.push_back(
          {{absl::StrCat(spec.params[i].fqn, ".", s), DType::kFloat32, spec.params[i].shape},
           true,
           Piece::Source::kState,
           s,
           unit.layout().param_ranges()[i].start,
           spec.params[i].numel});
    }
  }
  AppendStepPieces(spec, states, pieces);
  return pieces;
}

}  // namespace flatshard
