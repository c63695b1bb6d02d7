// Writes one rank's files of a checkpoint save (shard_checkpoint.cc plans
// the save and picks the source): what a SavePlan says goes where, read from
// a SaveSource, a chunk at a time. Internal to the worker's runtime.
#ifndef FLATSHARD_WORKER_RUNTIME_SAVE_WRITER_H_
#define FLATSHARD_WORKER_RUNTIME_SAVE_WRITER_H_

#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "flatshard/v1/common.pb.h"
#include "storage/file_system.h"
#include "worker/runtime/save_pieces.h"
#include "worker/runtime/shard_checkpoint.h"

namespace flatshard {

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

// Streams `source` into this rank's files of `plan` in `dir`, asking
// `aborted` (if set) before it creates them and before each write of at
// most kSaveWriteChunk elements: ABORTED once it says so. A file that cannot
// be written is reported in the result's write_status (the rank's other
// files are still written), not as an error.
absl::StatusOr<ShardSaveResult> WriteSaveFiles(SaveSource& source, const SavePlan& plan,
                                               const std::string& dir, FileSystem* fs,
                                               const std::function<bool()>& aborted);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_SAVE_WRITER_H_
