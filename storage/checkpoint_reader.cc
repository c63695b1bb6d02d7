#include "storage/checkpoint_reader.h"

#include <algorithm>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/flat_param_layout.h"
#include "core/model_spec.h"
#include "core/sharded_tensor_pieces.h"
#include "core/status_macros.h"
#include "storage/durable_file.h"

namespace flatshard {

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(const std::string& dir) {
  const std::string path = absl::StrCat(dir, "/", kManifestFileName);
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    if (absl::IsNotFound(text.status())) {
      return absl::NotFoundError(
          absl::StrCat(dir, " is not a committed checkpoint: it has no ", kManifestFileName));
    }
    return text.status();
  }
  ASSIGN_OR_RETURN(CheckpointManifest manifest, ParseManifest(*text, path));
  // Every file the type and world size imply must be listed: a rank's file
  // left out would otherwise read as "no state" (zeros) instead of failing.
  std::vector<std::string> expected;
  if (manifest.state_dict_type == v1::FULL_STATE_DICT) {
    expected = {std::string(kFullModelFile), std::string(kFullOptimFile)};
  } else {
    for (int r = 0; r < manifest.world_size; ++r) {
      expected.push_back(RankFileName("model", r, manifest.world_size));
      expected.push_back(RankFileName("optim", r, manifest.world_size));
    }
  }
  for (const std::string& name : expected) {
    bool listed = false;
    for (const CheckpointFile& f : manifest.files) listed |= f.name == name;
    if (!listed) {
      return absl::DataLossError(absl::StrCat(
          path, " does not list ", name, ", which a ", StateDictTypeName(manifest.state_dict_type),
          " checkpoint at world size ", manifest.world_size, " must have"));
    }
  }
  return std::unique_ptr<CheckpointReader>(new CheckpointReader(dir, std::move(manifest)));
}

CheckpointReader::CheckpointReader(std::string dir, CheckpointManifest manifest)
    : dir_(std::move(dir)), manifest_(std::move(manifest)), units_(HashUnits(manifest_)) {
  for (size_t u = 0; u < units_.size(); ++u) {
    file_units_[manifest_.files[units_[u].entry].name].push_back(u);
  }
  for (auto& [name, units] : file_units_) {
    std::sort(units.begin(), units.end(),
              [&](size_t a, size_t b) { return units_[a].offset < units_[b].offset; });
  }
}

absl::StatusOr<SafetensorsReader*> CheckpointReader::File(const std::string& file_name) {
  return OpenFile(file_name, /*hash=*/true);
}

absl::StatusOr<const CheckpointFile*> CheckpointReader::Listed(const std::string& file_name) const {
  for (const CheckpointFile& f : manifest_.files) {
    if (f.name == file_name) return &f;
  }
  return absl::NotFoundError(absl::StrCat(dir_, "/", file_name, " is not listed in the manifest"));
}

absl::StatusOr<std::vector<float>> CheckpointReader::ReadFull(absl::string_view kind,
                                                              const std::string& name,
                                                              const std::vector<int64_t>& shape) {
  return ReadRange(kind, name, shape, 0, static_cast<uint64_t>(NumElements(shape)));
}

absl::StatusOr<std::vector<float>> CheckpointReader::ReadRange(absl::string_view kind,
                                                               const std::string& name,
                                                               const std::vector<int64_t>& shape,
                                                               uint64_t begin, uint64_t end) {
  if (begin > end) {
    return absl::OutOfRangeError(
        absl::StrCat("elements [", begin, ", ", end, ") of '", name, "' are not a range"));
  }
  std::vector<float> out(end - begin);
  RETURN_IF_ERROR(ReadRangeInto(kind, name, shape, begin, out));
  return out;
}

absl::Status CheckpointReader::ReadRangeInto(absl::string_view kind, const std::string& name,
                                             const std::vector<int64_t>& shape, uint64_t begin,
                                             std::span<float> out) {
  return ReadRange(kind, name, shape, begin, out, /*defer=*/false);
}

absl::Status CheckpointReader::ReadRangeDeferred(absl::string_view kind, const std::string& name,
                                                 const std::vector<int64_t>& shape, uint64_t begin,
                                                 std::span<float> out) {
  return ReadRange(kind, name, shape, begin, out, /*defer=*/true);
}

absl::Status CheckpointReader::ReadTensorDeferred(const std::string& file_name,
                                                  absl::string_view tensor, uint64_t begin,
                                                  std::span<float> out) {
  RETURN_IF_ERROR(File(file_name).status());
  return ReadPart(file_name, tensor, begin, out, /*defer=*/true);
}

absl::Status CheckpointReader::ReadPart(const std::string& file_name, absl::string_view name,
                                        uint64_t begin, std::span<float> out, bool defer) {
  const SafetensorsReader& file = *open_.at(file_name);
  if (defer && sharing_) {
    absl::StatusOr<uint64_t> offset = file.Float32Offset(name, begin, out.size());
    if (offset.ok()) {
      // The share's units' reads land as they are hashed, the others'
      // after; a read is split where the file's hash units meet.
      const std::span<char> bytes(reinterpret_cast<char*>(out.data()), out.size_bytes());
      const std::vector<size_t>& units = file_units_.at(file_name);
      auto next = std::upper_bound(units.begin(), units.end(), *offset,
                                   [&](uint64_t at, size_t u) { return at < units_[u].offset; });
      if (next != units.begin()) --next;
      for (uint64_t at = *offset, end = *offset + bytes.size(); at < end; ++next) {
        const bool known = next != units.end();  // the units tile the file: always
        const uint64_t to = known ? std::min(end, units_[*next].offset + units_[*next].bytes) : end;
        auto pending = known ? pending_.find(*next) : pending_.end();
        (pending != pending_.end() ? pending->second : late_[file_name])
            .push_back({at, bytes.subspan(at - *offset, to - at)});
        at = to;
      }
      return absl::OkStatus();
    }
    // Another floating type is widened as it is read: now.
    if (!absl::IsFailedPrecondition(offset.status())) return offset.status();
  }
  return file.ReadFloatsInto(name, begin, out);
}

absl::Status CheckpointReader::ReadRange(absl::string_view kind, const std::string& name,
                                         const std::vector<int64_t>& shape, uint64_t begin,
                                         std::span<float> out, bool defer) {
  const uint64_t end = begin + out.size();
  const auto numel = static_cast<uint64_t>(NumElements(shape));
  if (end < begin || end > numel) {
    return absl::OutOfRangeError(
        absl::StrCat("elements [", begin, ", ", end, ") of '", name, "' are outside its ", numel));
  }
  auto check_shape = [&](const SafetensorsReader& file, const SafetensorsEntry& entry,
                         const std::vector<int64_t>& want) -> absl::Status {
    if (entry.shape != want) {
      return absl::InvalidArgumentError(absl::StrCat(
          file.path(), ": tensor '", name, "' has shape [", absl::StrJoin(entry.shape, ", "),
          "], expected [", absl::StrJoin(want, ", "), "]"));
    }
    return absl::OkStatus();
  };
  if (manifest_.state_dict_type == v1::FULL_STATE_DICT) {
    const std::string file_name(kind == "model" ? kFullModelFile : kFullOptimFile);
    ASSIGN_OR_RETURN(SafetensorsReader * file, File(file_name));
    ASSIGN_OR_RETURN(const SafetensorsEntry* entry, file->Find(name));
    RETURN_IF_ERROR(check_shape(*file, *entry, shape));
    return ReadPart(file_name, name, begin, out, defer);
  }
  if (manifest_.state_dict_type != v1::SHARDED_STATE_DICT) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir_, " is a LOCAL_STATE_DICT checkpoint: its files hold flat shards, not tensors"));
  }
  ASSIGN_OR_RETURN(std::vector<TensorPiece> pieces, PiecesOf(kind, name, shape));
  const int world = manifest_.world_size;
  if (pieces.empty() && !shape.empty()) return absl::OkStatus();  // no elements at all
  if (pieces.empty()) {  // a 0-dim value replicated on every rank: rank 0's copy
    const std::string file_name = RankFileName(kind, 0, world);
    ASSIGN_OR_RETURN(SafetensorsReader * file, File(file_name));
    ASSIGN_OR_RETURN(const SafetensorsEntry* entry, file->Find(name));
    RETURN_IF_ERROR(check_shape(*file, *entry, shape));
    return ReadPart(file_name, name, begin, out, defer);
  }
  // Every piece's file is opened before any is read: a file that fails leaves
  // no read of the others waiting to land in `out`.
  for (const TensorPiece& piece : pieces) {
    RETURN_IF_ERROR(File(RankFileName(kind, piece.file, world)).status());
  }
  for (const TensorPiece& piece : pieces) {
    const uint64_t lo = piece.offset, hi = piece.offset + piece.count;
    if (hi <= begin || lo >= end) continue;
    const uint64_t from = std::max(begin, lo), to = std::min(end, hi);
    RETURN_IF_ERROR(ReadPart(RankFileName(kind, piece.file, world), name, from - lo,
                             out.subspan(from - begin, to - from), defer));
  }
  return absl::OkStatus();
}

absl::StatusOr<const ElementOffsets*> CheckpointReader::PieceOffsets(const std::string& file_name) {
  if (auto it = offsets_.find(file_name); it != offsets_.end()) return &it->second;
  ASSIGN_OR_RETURN(SafetensorsReader * file, File(file_name));
  const auto& metadata = file->header().metadata;
  auto it = metadata.find(std::string(kElementOffsetsKey));
  ElementOffsets offsets;
  if (it != metadata.end()) {
    ASSIGN_OR_RETURN(offsets, ParseElementOffsets(it->second, file->path()));
  }
  for (const auto& [name, offset] : offsets) {
    ASSIGN_OR_RETURN(const SafetensorsEntry* entry, file->Find(name));
    if (entry->shape.size() != 1) {
      return absl::DataLossError(absl::StrCat(file->path(), ": piece '", name, "' has shape [",
                                              absl::StrJoin(entry->shape, ", "),
                                              "], not one dimension"));
    }
  }
  return &(offsets_[file_name] = std::move(offsets));
}

absl::StatusOr<std::vector<TensorPiece>> CheckpointReader::PiecesOf(
    absl::string_view kind, const std::string& name, const std::vector<int64_t>& shape) {
  const int world = manifest_.world_size;
  const auto numel = static_cast<uint64_t>(NumElements(shape));
  std::vector<TensorPiece> pieces;
  if (manifest_.format_version == kRowChunkFormatVersion) {
    // Rank r's file holds rows ChunkOf(dim0, W, r), shaped as the rows; 0-dim
    // values are replicated.
    if (shape.empty()) return pieces;
    const uint64_t row = shape[0] == 0 ? 0 : numel / static_cast<uint64_t>(shape[0]);
    for (int r = 0; r < world; ++r) {
      const ChunkSlice rows = ChunkOf(shape[0], world, r);
      if (rows.length == 0) continue;
      ASSIGN_OR_RETURN(SafetensorsReader * file, File(RankFileName(kind, r, world)));
      ASSIGN_OR_RETURN(const SafetensorsEntry* entry, file->Find(name));
      std::vector<int64_t> chunk_shape = shape;
      chunk_shape[0] = rows.length;
      if (entry->shape != chunk_shape) {
        return absl::InvalidArgumentError(absl::StrCat(
            file->path(), ": tensor '", name, "' has shape [", absl::StrJoin(entry->shape, ", "),
            "], expected [", absl::StrJoin(chunk_shape, ", "), "]"));
      }
      pieces.push_back(
          {r, static_cast<uint64_t>(rows.begin) * row, static_cast<uint64_t>(rows.length) * row});
    }
  } else {
    for (int r = 0; r < world; ++r) {
      const std::string file_name = RankFileName(kind, r, world);
      ASSIGN_OR_RETURN(const ElementOffsets* offsets, PieceOffsets(file_name));
      auto it = offsets->find(name);
      if (it == offsets->end()) continue;
      ASSIGN_OR_RETURN(SafetensorsReader * file, File(file_name));
      ASSIGN_OR_RETURN(const SafetensorsEntry* entry, file->Find(name));
      pieces.push_back({r, it->second, static_cast<uint64_t>(entry->shape[0])});
    }
    if (pieces.empty()) {
      if (numel == 0) return pieces;  // no piece has an element of it
      // Held whole by every rank (a 0-dim step), or by none: Find says which.
      ASSIGN_OR_RETURN(SafetensorsReader * file, File(RankFileName(kind, 0, world)));
      RETURN_IF_ERROR(file->Find(name).status());
      if (!shape.empty()) {
        return absl::DataLossError(
            absl::StrCat(file->path(), ": '", name, "' is whole in the file, not a piece"));
      }
      return pieces;
    }
  }
  RETURN_IF_ERROR(CheckTiling(pieces, numel, name, dir_));
  return pieces;
}

}  // namespace flatshard
