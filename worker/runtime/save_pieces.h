// What the tensors of a rank's checkpoint files hold, planned before a save
// writes anything (shard_checkpoint.cc streams them): for each unit, the
// pieces this rank writes, in file order.
#ifndef FLATSHARD_WORKER_RUNTIME_SAVE_PIECES_H_
#define FLATSHARD_WORKER_RUNTIME_SAVE_PIECES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "core/safetensors_file_writer.h"
#include "flatshard/v1/common.pb.h"
#include "worker/runtime/flat_param_unit.h"

namespace flatshard {

// What one tensor of a rank's file holds: a slice of a gathered flat value
// (FULL: a whole parameter or state), a slice of this rank's shard (SHARDED:
// the elements of a parameter or state it covers; LOCAL: the flat shard), or
// a step.
struct Piece {
  enum class Source { kParam, kState, kStep, kLocalFlat, kLocalState };
  SafetensorsSlot slot;
  bool optim = false;
  Source source = Source::kParam;
  std::string state;       // kState, kLocalState
  int64_t flat_begin = 0;  // element offset into the gathered flat (FULL) / shard
  int64_t count = 0;
  // SHARDED: where the piece starts in the tensor's flattening
  // (sharded_tensor_pieces.h); -1 for whole tensors.
  int64_t element_offset = -1;
};

// The pieces of `unit` (optimizer state names `states`) that rank `rank` of
// `world` writes for a save of `type`, in file order.
std::vector<Piece> UnitPieces(const FlatParamUnit& unit, const std::vector<std::string>& states,
                              v1::StateDictType type, int rank, int world);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_SAVE_PIECES_H_
