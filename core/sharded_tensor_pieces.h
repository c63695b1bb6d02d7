// What a SHARDED checkpoint file holds (format version 2, docs/checkpoints.md):
// a piece of each tensor, a contiguous range of its row-major flattening,
// stored as a 1-D tensor of the range's elements, with the range's first
// element recorded in the file's safetensors metadata under
// kElementOffsetsKey (one JSON object, tensor name -> offset). The pieces of a
// tensor across a checkpoint's files tile it exactly. Tensors a file holds
// whole and replicated (the 0-dim "<fqn>.step" of every rank's optim file)
// have no offset.
//
// A save writes each rank's own flat-shard ranges, so it needs no collective;
// a version 1 file held rows ChunkOf(dim0, W, r) instead, which made every
// rank exchange half its state before writing.
#ifndef FLATSHARD_CORE_SHARDED_TENSOR_PIECES_H_
#define FLATSHARD_CORE_SHARDED_TENSOR_PIECES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flatshard {

inline constexpr absl::string_view kElementOffsetsKey = "element_offsets";

// A file's pieces: tensor name -> the element its piece starts at.
using ElementOffsets = std::map<std::string, uint64_t>;

std::string ElementOffsetsToJson(const std::map<std::string, int64_t>& offsets);

// INVALID_ARGUMENT naming `what` unless `json` is an object of non-negative
// integers.
absl::StatusOr<ElementOffsets> ParseElementOffsets(absl::string_view json, absl::string_view what);

// One file's piece of a tensor: elements [offset, offset + count).
struct TensorPiece {
  int file = 0;  // the caller's index of the file that holds it
  uint64_t offset = 0;
  uint64_t count = 0;
};

// Sorts `pieces` by offset and checks that they tile [0, numel) exactly:
// DATA_LOSS naming `name` and `where` at a gap, an overlap or a piece past the
// end.
absl::Status CheckTiling(std::vector<TensorPiece>& pieces, uint64_t numel, absl::string_view name,
                         absl::string_view where);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_SHARDED_TENSOR_PIECES_H_
