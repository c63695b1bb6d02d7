#include "worker/runtime/save_writer.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "storage/safetensors_file_writer.h"
#include "storage/safetensors_region_writer.h"

namespace flatshard {
namespace {

// Collects a file's write error and keeps going, so a rank whose disk fails
// still returns its other files' outcome with the error (no save has a
// collective left to hang on, but the rank reports one status for the save).
// A FULL file is written by every rank at once, each its own elements in
// place (SafetensorsRegionWriter); the others have one writer.
class TolerantWriter {
 public:
  TolerantWriter(const std::string& path, const SavePlanFile& file, bool shared, int rank,
                 FileSystem* fs)
      : name_(std::filesystem::path(path).filename().string()), rank_(rank) {
    if (shared) {
      auto writer = SafetensorsRegionWriter::Open(path, file.slots, file.metadata,
                                                  /*writes_header=*/rank == 0, fs);
      if (writer.ok()) {
        shared_ = *std::move(writer);
      } else {
        status_ = writer.status();
      }
    } else {
      auto writer = SafetensorsFileWriter::Create(path, file.slots, file.metadata, fs);
      if (writer.ok()) {
        whole_ = *std::move(writer);
      } else {
        status_ = writer.status();
      }
    }
  }
  // Elements [begin, begin + values.size()) of tensor `name` (a whole
  // tensor, in file order, unless the file is shared).
  void Write(const std::string& name, uint64_t begin, std::span<const float> values) {
    if (!status_.ok()) return;
    status_ =
        shared_ != nullptr ? shared_->Write(name, begin, values) : whole_->Append(name, values);
  }
  // Its manifest entry; none for a shared file this rank wrote nothing of.
  absl::StatusOr<std::optional<CheckpointFile>> Finish() {
    RETURN_IF_ERROR(status_);
    if (shared_ != nullptr) {
      ASSIGN_OR_RETURN(SafetensorsRegionWriter::Written written, shared_->Finish());
      if (written.regions.empty()) return std::nullopt;
      return CheckpointFile{name_, rank_, written.file_bytes, "", std::move(written.regions)};
    }
    ASSIGN_OR_RETURN(FileDigest digest, whole_->Finish());
    return CheckpointFile{name_, rank_, digest.bytes, digest.xxh3, {}};
  }

 private:
  std::string name_;
  int rank_;
  std::unique_ptr<SafetensorsFileWriter> whole_;
  std::unique_ptr<SafetensorsRegionWriter> shared_;
  absl::Status status_;
};

// Writes every piece this rank holds into its files. SHARDED and LOCAL:
// this rank's own elements, straight from its shard and states. FULL: the
// same elements, at their places in the whole tensors of the shared files
// (the pieces are whole tensors in file order, so each rank's writes go
// forward through each file); rank 0 writes the 0-dim steps. No collective:
// nothing moves between ranks, so `aborted` (if set) is asked before each
// write of at most kSaveWriteChunk elements (a piece, one tensor's part, is
// written in such chunks), and an aborted save lets go within one chunk
// rather than one tensor, however large.
absl::Status StreamSave(SaveSource& source, const SavePlan& plan, TolerantWriter& model,
                        TolerantWriter& optim, const std::function<bool()>& aborted) {
  const bool full = plan.type == v1::FULL_STATE_DICT;
  for (size_t u = 0; u < plan.pieces.size(); ++u) {
    const float step = source.Step(u);
    const auto stopped = [&]() -> absl::Status {
      if (!aborted || !aborted()) return absl::OkStatus();
      return absl::AbortedError(
          absl::StrCat("the save was aborted after ", u, " of ", plan.pieces.size(), " units"));
    };
    for (const Piece& piece : plan.pieces[u]) {
      RETURN_IF_ERROR(stopped());
      TolerantWriter& raw = piece.optim ? optim : model;
      // Elements [begin, begin + values.size()) of tensor `name`, a chunk
      // at a time (the first after the check above).
      const auto write = [&](const std::string& name, uint64_t begin,
                             std::span<const float> values) -> absl::Status {
        for (size_t k = 0; k == 0 || k < values.size(); k += kSaveWriteChunk) {
          if (k > 0) RETURN_IF_ERROR(stopped());
          raw.Write(name, begin + k,
                    values.subspan(k, std::min(kSaveWriteChunk, values.size() - k)));
        }
        return absl::OkStatus();
      };
      if (piece.source == Piece::Source::kStep) {
        if (!full || plan.rank == 0) {
          raw.Write(piece.slot.name, 0, std::span<const float>(&step, 1));
        }
        continue;
      }
      std::span<const float> values;
      if (piece.source == Piece::Source::kParam || piece.source == Piece::Source::kLocalFlat) {
        values = source.Shard(u);
      } else {
        ASSIGN_OR_RETURN(values, source.State(u, piece.state));
      }
      if (!full) {
        RETURN_IF_ERROR(write(piece.slot.name, 0,
                              values.subspan(static_cast<size_t>(piece.flat_begin),
                                             static_cast<size_t>(piece.count))));
        continue;
      }
      const WrittenRange& mine = plan.ranges[u];
      const int64_t from = std::max(mine.begin, piece.flat_begin);
      const int64_t to = std::min(mine.end, piece.flat_begin + piece.count);
      if (from >= to) continue;
      RETURN_IF_ERROR(write(piece.slot.name, static_cast<uint64_t>(from - piece.flat_begin),
                            values.subspan(static_cast<size_t>(from - mine.shard_begin),
                                           static_cast<size_t>(to - from))));
    }
  }
  return absl::OkStatus();
}

ShardSaveResult FinishWriters(const std::vector<TolerantWriter*>& writers) {
  ShardSaveResult result;
  for (TolerantWriter* writer : writers) {
    absl::StatusOr<std::optional<CheckpointFile>> file = writer->Finish();
    if (!file.ok()) {
      if (result.write_status.ok()) result.write_status = file.status();
      continue;
    }
    if (file->has_value()) result.files.push_back(**std::move(file));
  }
  return result;
}

}  // namespace

absl::StatusOr<ShardSaveResult> WriteSaveFiles(SaveSource& source, const SavePlan& plan,
                                               const std::string& dir, FileSystem* fs,
                                               const std::function<bool()>& aborted) {
  // Not one file for a save aborted before it began (a FULL file's header
  // would stay behind: shared files are not removed by their writers).
  if (aborted && aborted()) {
    return absl::AbortedError(
        absl::StrCat("the save was aborted after 0 of ", plan.pieces.size(), " units"));
  }
  const bool shared = plan.type == v1::FULL_STATE_DICT;
  TolerantWriter model(absl::StrCat(dir, "/", plan.model.name), plan.model, shared, plan.rank, fs);
  TolerantWriter optim(absl::StrCat(dir, "/", plan.optim.name), plan.optim, shared, plan.rank, fs);
  RETURN_IF_ERROR(StreamSave(source, plan, model, optim, aborted));
  return FinishWriters({&model, &optim});
}

}  // namespace flatshard
