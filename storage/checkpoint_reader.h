// Reads a committed checkpoint directory: its manifest, and full tensors out of
// FULL files or reassembled from the pieces in SHARDED files (format version 2:
// contiguous element ranges with their offsets in each file's metadata,
// core/sharded_tensor_pieces.h; version 1: rank r of W holds rows
// ChunkOf(dim0, W, r)), so a reader at any world size or wrap policy gets the
// same values. Every file is checked against the manifest's size and XXH3
// (a file several ranks wrote, format version 3: each region's) before its
// first use; a mismatch is DATA_LOSS naming the file (and the region and its
// writer). Used by workers on LoadShard and by the offline tools.
#ifndef FLATSHARD_STORAGE_CHECKPOINT_READER_H_
#define FLATSHARD_STORAGE_CHECKPOINT_READER_H_

#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/sharded_tensor_pieces.h"
#include "storage/checkpoint_manifest.h"
#include "storage/safetensors_reader.h"

namespace flatshard {

class CheckpointReader {
 public:
  // NOT_FOUND when `dir` has no manifest (a save that never committed).
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const CheckpointManifest& manifest() const { return manifest_; }

  // The full value of tensor `name` with `shape` from the "model" or "optim"
  // files (FULL or SHARDED). NOT_FOUND when no file holds it; INVALID_ARGUMENT
  // when a chunk's shape disagrees with `shape`.
  absl::StatusOr<std::vector<float>> ReadFull(absl::string_view kind, const std::string& name,
                                              const std::vector<int64_t>& shape);

  // Elements [begin, end) of the row-major flattening of tensor `name`: from
  // a FULL file directly, from SHARDED files by intersecting [begin, end) with
  // each file's piece, so a reader touches only what it needs. DATA_LOSS when
  // the pieces do not tile the tensor (a gap, an overlap, a piece past its
  // end).
  absl::StatusOr<std::vector<float>> ReadRange(absl::string_view kind, const std::string& name,
                                               const std::vector<int64_t>& shape, uint64_t begin,
                                               uint64_t end);
  // The same for elements [begin, begin + out.size()), read straight into
  // `out`. On an error `out` may hold part of the range.
  absl::Status ReadRangeInto(absl::string_view kind, const std::string& name,
                             const std::vector<int64_t>& shape, uint64_t begin,
                             std::span<float> out);

  // One of the manifest's files, opened and verified (size, XXH3 and
  // header), unless VerifyShare already opened it.
  absl::StatusOr<SafetensorsReader*> File(const std::string& file_name);

  // Verifies every file (size, XXH3, header) and that no file is missing.
  absl::Status VerifyAll();

  // Verifies reader `index`'s share of `count`: every file's size and header,
  // and the XXH3 of the hash units Verifiers assigns to `index`; the rest are
  // opened unhashed, their content vouched for by the reader they belong
  // to. `count` readers that all succeed have hashed every byte once between
  // them instead of `count` times: a load's stage is that case (every rank
  // stages and none applies unless all staged, docs/checkpoints.md).
  // BeginShare then FinishShare(true).
  absl::Status VerifyShare(int index, int count);

  // VerifyShare in two halves, with the hashing folded into the reads: a
  // load's stage reads much of what it verifies, and reading it once to hash
  // and again for its data crossed every byte from the disk twice.
  // BeginShare checks every file's size and header and hashes nothing yet (a
  // share's file that fails that is hashed at once, so damage is reported as
  // damage). ReadRangeDeferred is ReadRangeInto for a caller that keeps `out`
  // alive and unread until FinishShare: float32 elements in a hash unit of
  // the share are read then, each unit once, in order, into the callers'
  // spans while the bytes are hashed as they land; deferred float32 reads
  // from the other units land after those, each file's in offset order
  // (reading them at once cut across the verifiers' streams on the disk).
  // FinishShare(false) only verifies: after a staging that failed, whose
  // spans may be gone. Reads that are not deferred work as ever, before and
  // after. `stop` (if set) is asked before each MiB FinishShare reads: once
  // it answers true the share ends ABORTED, unverified, with the callers'
  // spans partly written (a load whose job was aborted lets go instead of
  // streaming on, and throws its staging away).
  // FAILED_PRECONDITION for a second share of the same reader.
  // BeginShare asks `stop` the same way while it hashes a share's damaged
  // file (to report the damage as such).
  absl::Status BeginShare(int index, int count, const std::function<bool()>& stop = {});
  absl::Status ReadRangeDeferred(absl::string_view kind, const std::string& name,
                                 const std::vector<int64_t>& shape, uint64_t begin,
                                 std::span<float> out);
  // Elements [begin, begin + out.size()) of tensor `tensor` of manifest file
  // `file_name` (a LOCAL checkpoint's flat shards), deferred the same way.
  absl::Status ReadTensorDeferred(const std::string& file_name, absl::string_view tensor,
                                  uint64_t begin, std::span<float> out);
  absl::Status FinishShare(bool deliver, const std::function<bool()>& stop = {});

  // What verifiers hash, one unit at a time: each file one rank wrote whole,
  // and each region of a file several ranks wrote (FULL, format version 3),
  // those in file order after the whole files.
  struct HashUnit {
    size_t entry = 0;  // the manifest entry that lists it
    uint64_t offset = 0;
    uint64_t bytes = 0;
    std::string xxh3;
  };
  static std::vector<HashUnit> HashUnits(const CheckpointManifest& manifest);
  // Which of `count` readers hashes each of HashUnits(manifest). Whole files
  // go in the order of the ranks that wrote them, dealt in contiguous blocks
  // as even as they divide: at the saving world size each rank hashes the
  // files it wrote. Regions go in file order, dealt by bytes: each reader
  // streams one contiguous part of the shared files, whoever wrote it (a
  // writer's own regions alternate with the others' through each file, a
  // pattern a disk serves slower than one stream per reader).
  static std::vector<int> Verifiers(const CheckpointManifest& manifest, int count);

 private:
  CheckpointReader(std::string dir, CheckpointManifest manifest);
  // Opens `file_name`, checking its size and header, and its XXH3 if `hash`
  // (asking `stop`, if set, before each MiB).
  absl::StatusOr<SafetensorsReader*> OpenFile(const std::string& file_name, bool hash,
                                              const std::function<bool()>& stop = {});
  // The manifest's entry for `file_name`; NOT_FOUND naming its path if none.
  absl::StatusOr<const CheckpointFile*> Listed(const std::string& file_name) const;
  // ReadRangeInto's body; float32 parts wait for FinishShare when `defer`
  // and a share is begun.
  absl::Status ReadRange(absl::string_view kind, const std::string& name,
                         const std::vector<int64_t>& shape, uint64_t begin, std::span<float> out,
                         bool defer);
  // Elements of tensor `name` of open file `file_name` into `out`: now, or at
  // FinishShare when `defer`, a share is begun and the tensor is float32
  // (as the file is hashed for the share's files, after them for the rest).
  absl::Status ReadPart(const std::string& file_name, absl::string_view name, uint64_t begin,
                        std::span<float> out, bool defer);
  // A read waiting for FinishShare: file bytes [offset, offset + out.size()).
  struct DeferredRead {
    uint64_t offset = 0;
    std::span<char> out;
  };
  // Reads hash unit `index` start to end, the deferred reads straight into
  // their spans and the rest through a buffer, hashing every byte once, and
  // checks the hash against the manifest.
  absl::Status HashWhileReading(size_t index, bool deliver, const std::function<bool()>& stop);
  // `read`, a MiB at a time, asking `stop` (if set) before each.
  static absl::Status ReadStoppable(const SafetensorsReader& file, const DeferredRead& read,
                                    const std::function<bool()>& stop);
  static constexpr size_t kStopChunk = size_t{1} << 20;
  // A version 2 SHARDED file's pieces: tensor name -> element offset (each a
  // 1-D tensor), parsed once per file.
  absl::StatusOr<const ElementOffsets*> PieceOffsets(const std::string& file_name);
  // The pieces of SHARDED tensor `name`, sorted and checked to tile it; empty
  // for a 0-dim value every rank's file holds whole.
  absl::StatusOr<std::vector<TensorPiece>> PiecesOf(absl::string_view kind, const std::string& name,
                                                    const std::vector<int64_t>& shape);

  std::string dir_;
  CheckpointManifest manifest_;
  std::map<std::string, std::unique_ptr<SafetensorsReader>> open_;
  std::map<std::string, ElementOffsets> offsets_;
  std::vector<HashUnit> units_;  // HashUnits(manifest_)
  // Each file's hash units (indices into units_), by offset: they tile it.
  std::map<std::string, std::vector<size_t>> file_units_;
  // The share's hash units not yet hashed, with the reads waiting for them.
  std::map<size_t, std::vector<DeferredRead>> pending_;
  // Deferred reads from files outside the share, done after it is hashed.
  std::map<std::string, std::vector<DeferredRead>> late_;
  bool sharing_ = false;      // between BeginShare and FinishShare
  bool share_begun_ = false;  // one share per reader
};

}  // namespace flatshard

#endif  // FLATSHARD_STORAGE_CHECKPOINT_READER_H_
