// A checkpoint's manifest.json (docs/architecture.md §6): written last, by the
// coordinator, after every worker has fsynced its files and reported their
// checksums, so its presence is what makes a checkpoint exist. It embeds the
// job spec, from which offline tools (consolidate, reshard) recompute the units
// and flat layouts with the same code the cluster used.
#ifndef FLATSHARD_STORAGE_CHECKPOINT_MANIFEST_H_
#define FLATSHARD_STORAGE_CHECKPOINT_MANIFEST_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/dtype.h"
#include "flatshard/v1/common.pb.h"
#include "flatshard/v1/job.pb.h"
#include "storage/durable_file.h"

namespace flatshard {

// Version 3: a FULL file is written by every rank at once, each writing the
// bytes its shard holds in place (CheckpointFile::regions). Version 2: SHARDED
// files hold contiguous element ranges of each tensor with their offsets in
// the file's metadata (sharded_tensor_pieces.h), written straight from each
// rank's flat shard. Version 1: SHARDED files held rows ChunkOf(dim0, W, r).
// All three are read; the files' contents differ only as said.
inline constexpr int kCheckpointFormatVersion = 3;
inline constexpr int kRowChunkFormatVersion = 1;
inline constexpr absl::string_view kManifestFileName = "manifest.json";
inline constexpr absl::string_view kLatestFileName = "latest";
inline constexpr absl::string_view kPartialSuffix = ".partial";

// A byte range of a file one rank wrote, and the XXH3 of its bytes.
struct FileRegion {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  std::string xxh3;
  bool operator==(const FileRegion&) const = default;
};

// What one rank wrote of a checkpoint file. Most files have one writer, which
// wrote all of it (`xxh3` the file's, no `regions`). A FULL file is written by
// every rank at once (format version 3): each rank's entry lists the regions
// it wrote, in increasing offset order, each with its own hash (so any reader
// can verify any region, and a load can hand each reader one contiguous part
// of the file), and the entries of one file tile it exactly.
struct CheckpointFile {
  std::string name;    // relative to the checkpoint directory
  int rank = 0;        // the worker that wrote it
  uint64_t bytes = 0;  // the file's size
  std::string xxh3;    // the whole file's; empty when `regions` are listed
  std::vector<FileRegion> regions;
};

struct CheckpointTensorInfo {
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
};

struct CheckpointManifest {
  int format_version = kCheckpointFormatVersion;
  std::string name;
  std::string job;
  v1::JobSpec job_spec;
  std::string job_spec_digest;  // xxh3 of the serialized spec
  int64_t step = 0;             // steps completed; training resumes at this step
  v1::StateDictType state_dict_type = v1::FULL_STATE_DICT;
  int world_size = 0;
  std::string strategy;  // effective sharding strategy
  // Every primary parameter's full shape (tied aliases in `tied`).
  std::map<std::string, CheckpointTensorInfo> params;
  std::map<std::string, std::string> tied;    // alias FQN -> primary FQN
  std::string optimizer;                      // sgd, adam, adamw
  std::vector<std::string> optimizer_states;  // tensor states saved per param
  // Data position: the data sets are pure functions of (seed, step), so the
  // next batch is batch `step`; nothing else is random during training.
  uint64_t data_seed = 0;
  int64_t data_position = 0;  // global batches consumed (no_sync micro-steps count)
  int64_t global_batch_size = 0;
  uint64_t init_seed = 0;
  int64_t created_unix_micros = 0;
  // Taken by the job's schedule (every_steps). Retention (keep_last) retires
  // only these: a checkpoint a user asked for is never deleted behind their back.
  bool scheduled = false;
  // The checkpoint this one is a copy of (`flatshard ckpt consolidate` or
  // `reshard`: the source's name); empty for a save. A copy holds its
  // source's state and keeps its time, and the catalog lists it before a
  // checkpoint of the same time that is not one: the source stays the
  // newest, the one a recovery restores and the job's state is named by.
  std::string converted_from;
  std::vector<CheckpointFile> files;
};

// That the entries of each file several ranks wrote agree on its size and
// their regions tile it, each rank's in file order: every byte vouched for by
// exactly one region's hash. INVALID_ARGUMENT naming `what` and the file.
absl::Status CheckFileRegions(const std::vector<CheckpointFile>& files, absl::string_view what);

// The bytes of a checkpoint's files, each file counted once however many
// ranks wrote it.
uint64_t CheckpointBytes(const CheckpointManifest& manifest);

// The digest manifests record for a spec.
std::string JobSpecDigest(const v1::JobSpec& spec);

std::string ManifestToJson(const CheckpointManifest& manifest);
// INVALID_ARGUMENT naming `what` and the field for anything malformed or from
// a newer format version.
absl::StatusOr<CheckpointManifest> ParseManifest(absl::string_view json, absl::string_view what);

// A checkpoint name is one path component that cannot escape the root or
// collide with its bookkeeping: 1-128 of [A-Za-z0-9._-], not starting with '.',
// not ending in ".partial" or ".tmp", not "latest".
absl::Status ValidateCheckpointName(absl::string_view name);

// "model-rank00002-of-00004.safetensors".
std::string RankFileName(absl::string_view kind, int rank, int world_size);
inline constexpr absl::string_view kFullModelFile = "model.safetensors";
inline constexpr absl::string_view kFullOptimFile = "optim.safetensors";

absl::string_view StateDictTypeName(v1::StateDictType type);  // "SHARDED_STATE_DICT"
// FULL / SHARDED / LOCAL, with or without the _STATE_DICT suffix, any case.
absl::StatusOr<v1::StateDictType> ParseStateDictType(absl::string_view name);

}  // namespace flatshard

#endif  // FLATSHARD_STORAGE_CHECKPOINT_MANIFEST_H_
