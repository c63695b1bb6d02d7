// Offline checkpoint conversion, with no cluster: `flatshard ckpt consolidate`
// (SHARDED or LOCAL -> FULL) and `flatshard ckpt reshard --world-size N`
// (-> SHARDED at N). LOCAL files are flat shards; their layouts are recomputed
// from the job spec embedded in the manifest with the code the cluster used.
// The output is committed like a cluster save: files and manifest written
// into <out>.partial/, fsynced, renamed to <out>.
#ifndef FLATSHARD_STORAGE_CHECKPOINT_CONVERT_H_
#define FLATSHARD_STORAGE_CHECKPOINT_CONVERT_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"

#include "storage/checkpoint_manifest.h"

namespace flatshard {

// Progress lines ("wrote model.safetensors (12.3 MB)").
using ConvertProgress = std::function<void(const std::string&)>;

absl::StatusOr<CheckpointManifest> ConsolidateCheckpoint(const std::string& src_dir,
                                                         const std::string& out_dir,
                                                         const ConvertProgress& progress = {});

absl::StatusOr<CheckpointManifest> ReshardCheckpoint(const std::string& src_dir,
                                                     const std::string& out_dir, int world_size,
                                                     const ConvertProgress& progress = {});

}  // namespace flatshard

#endif  // FLATSHARD_STORAGE_CHECKPOINT_CONVERT_H_
