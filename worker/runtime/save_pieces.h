// What the tensors of a rank's checkpoint files hold, planned before a save
// writes anything (save_writer.cc streams them): for each unit, the
// pieces this rank writes, in file order.
#ifndef FLATSHARD_WORKER_RUNTIME_SAVE_PIECES_H_
#define FLATSHARD_WORKER_RUNTIME_SAVE_PIECES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "flatshard/v1/common.pb.h"
#include "storage/safetensors_file_writer.h"
#include "worker/runtime/flat_param_unit.h"

namespace flatshard {

// What one tensor of a rank's file holds: a whole parameter or state (FULL,
// whose flat range the rank intersects with its own: every rank writes its
// part in place), a slice of this rank's shard (SHARDED: the elements of a
// parameter or state it covers; LOCAL: the flat shard), or a step.
struct Piece {
  enum class Source { kParam, kState, kStep, kLocalFlat, kLocalState };
  SafetensorsSlot slot;
  bool optim = false;
  Source source = Source::kParam;
  std::string state;       // kState, kLocalState
  int64_t flat_begin = 0;  // element offset into the unit's flat value (FULL) / shard
  int64_t count = 0;
  // SHARDED: where the piece starts in the tensor's flattening
  // (sharded_tensor_pieces.h); -1 for whole tensors.
  int64_t element_offset = -1;
};

// One file a rank writes: its name, its tensors in file order, its metadata.
struct SavePlanFile {
  std::string name;
  std::vector<SafetensorsSlot> slots;
  std::map<std::string, std::string> metadata;
};

// The elements of a unit's unpadded flat value (N) that a rank writes in a
// SHARDED or FULL save: [begin, end), which its flat shard holds from
// element shard_begin on. The replicas of a shard (HYBRID_SHARD; every rank,
// for a unit that is not sharded) split its range evenly, so every element is
// written by exactly one rank and no rank sends anything to another.
struct WrittenRange {
  int64_t shard_begin = 0;
  int64_t begin = 0;
  int64_t end = 0;
};
WrittenRange RangeWrittenBy(const FlatParamUnit& unit, int rank, int world);

// The pieces of `unit` (optimizer state names `states`) that rank `rank` of
// `world` writes for a save of `type`, in file order.
std::vector<Piece> UnitPieces(const FlatParamUnit& unit, const std::vector<std::string>& states,
                              v1::StateDictType type, int rank, int world);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_SAVE_PIECES_H_
