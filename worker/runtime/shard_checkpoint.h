// One rank's part of saving and loading a checkpoint (docs/architecture.md §6;
// docs/fsdp-semantics.md §5.2–5.4, §6.3–6.4). Every rank calls these together;
// no save moves data between ranks: each writes what its own shard holds.
//   FULL     every rank writes into model.safetensors (every FQN, tied aliases
//            included) and optim.safetensors (<fqn>.<state>, <fqn>.step) the
//            elements its shard holds, in place (storage/safetensors_region_writer.h;
//            rank 0 the headers and steps), and reports the regions it wrote;
//   SHARDED  rank r writes model-rank<r>-of-<W> and optim-rank<r>-of-<W> with
//            the elements of every parameter and state its flat shard holds
//            (core/sharded_tensor_pieces.h: 1-D pieces, their offsets in the
//            metadata; under HYBRID_SHARD each replica writes its part);
//   LOCAL    rank r writes its flat shards as they are (<unit>._flat_param,
//            unpadded) with the layout's digest in the file's metadata.
// Loading reads FULL or SHARDED tensors at any world size and wrap policy
// (re-flattened with this job's layout, §6.4's flatten-and-shard path);
// LOCAL only into the identical layout and world size.
#ifndef FLATSHARD_WORKER_RUNTIME_SHARD_CHECKPOINT_H_
#define FLATSHARD_WORKER_RUNTIME_SHARD_CHECKPOINT_H_

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/model_spec.h"
#include "storage/checkpoint_manifest.h"
#include "storage/safetensors_file_writer.h"
#include "worker/runtime/fsdp_runtime.h"
#include "worker/runtime/staged_floats.h"

namespace flatshard {

struct ShardSaveResult {
  // Sizes and checksums (of the regions this rank wrote, for a FULL file);
  // none for a file it wrote nothing of.
  std::vector<CheckpointFile> files;
  // A file that could not be written: the job stays usable, only this
  // checkpoint fails.
  absl::Status write_status;
};

// Writes this rank's files into the existing directory `dir`. An error status
// means the state could not be read (a copy off the device failed).
absl::StatusOr<ShardSaveResult> SaveShardCheckpoint(FsdpRuntime& runtime, const std::string& dir,
                                                    v1::StateDictType type);

// A save's snapshot: host copies of this rank's shards and optimizer state
// (one device-to-host copy each, into pinned memory the snapshot keeps; no
// collectives) and the plan of the files to write. The copies run on the
// runtime's snapshot stream (FsdpRuntime::BeginSnapshotCopies) and complete at
// `copied`: taking a snapshot only enqueues them, so training resumes at once
// and its next forward and backward overlap them; its next update waits. The
// writers only read the copies (no save has a collective).
struct SavePlan;
struct ShardSnapshot {
  struct Unit {
    PinnedBuffer shard;                          // S floats
    std::map<std::string, PinnedBuffer> states;  // S floats each
    std::vector<std::string> state_order;        // torch's order, as the optimizer lists them
    float step = 0;
  };
  std::shared_ptr<const SavePlan> plan;
  FileSystem* file_system = nullptr;  // the runtime's (null: FileSystem::Default())
  std::vector<Unit> units;
  std::shared_ptr<Event> copied;  // the copies into `units` are complete

  ShardSnapshot() = default;
  ShardSnapshot(ShardSnapshot&&) = default;
  ShardSnapshot& operator=(ShardSnapshot&&) = default;
  // Waits for `copied`: the copies write into memory this snapshot frees.
  ~ShardSnapshot();

  uint64_t bytes() const;
};

absl::StatusOr<ShardSnapshot> SnapshotShardCheckpoint(FsdpRuntime& runtime, v1::StateDictType type);
// A save writes each tensor's part in writes of at most this many elements
// (4 MiB of float32), asking for its abort before each one.
inline constexpr size_t kSaveWriteChunk = size_t{1} << 20;
// Writes a snapshot's files into the existing directory `dir`. File errors
// are in write_status; an error status is one the save could not go on from
// (a snapshot copy that failed). `aborted` (the runtime's, or the
// background saves') is asked before the files are created and before each
// write (kSaveWriteChunk): ABORTED once it says so, and this rank's files removed
// (a shared FULL file goes with its abandoned directory).
absl::StatusOr<ShardSaveResult> WriteShardSnapshot(const ShardSnapshot& snapshot,
                                                   const std::string& dir,
                                                   const std::function<bool()>& aborted = {});

// A checkpoint read and validated into memory, ready to replace the runtime's
// shards: loading is staged on every rank first and applied only when all
// ranks staged, so a bad file on one rank leaves every rank's state untouched.
// The staged values are StagedFloats (staged_floats.h): every element written
// by the stager, moved into the runtime at the apply.
struct StagedCheckpoint {
  CheckpointManifest manifest;
  std::vector<StagedFloats> shards;  // per unit, S elements
  // Per unit: state name -> S elements, and the optimizer step.
  std::vector<std::map<std::string, StagedFloats>> states;
  std::vector<std::optional<float>> steps;
};

// Reads this rank's part of the committed checkpoint in `dir` (no
// collectives). FAILED_PRECONDITION when it cannot be loaded into this job
// (LOCAL at another layout, another optimizer, other parameters), DATA_LOSS
// or INVALID_ARGUMENT naming the file when a file is damaged.
absl::StatusOr<StagedCheckpoint> StageShardCheckpoint(FsdpRuntime& runtime, const std::string& dir);

// Replaces the shards and optimizer state with a staged checkpoint (reshards
// any unit left unsharded first, so no stale view survives).
absl::Status ApplyStagedCheckpoint(FsdpRuntime& runtime, StagedCheckpoint staged);

// A LOCAL checkpoint's name for a unit's flat shard: <module>._flat_param.
inline std::string LocalFlatTensorName(const Unit& unit) {
  return JoinFqn(unit.module_fqn, "_flat_param");
}

// The digest of a runtime's flat layouts (units, params, padding, shard size,
// world size), which LOCAL files record and loading compares.
std::string LocalLayoutDigest(const FsdpRuntime& runtime);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_SHARD_CHECKPOINT_H_
