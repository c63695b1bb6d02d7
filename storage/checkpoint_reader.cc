#include "storage/checkpoint_reader.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <set>
#include <system_error>

#include <xxhash.h>

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

std::vector<CheckpointReader::HashUnit> CheckpointReader::HashUnits(
    const CheckpointManifest& manifest) {
  std::vector<HashUnit> units;
  std::vector<std::string> shared;  // files several ranks wrote, in the manifest's order
  std::map<std::string, std::vector<HashUnit>> regions;
  for (size_t i = 0; i < manifest.files.size(); ++i) {
    const CheckpointFile& f = manifest.files[i];
    if (f.regions.empty()) {
      units.push_back({i, 0, f.bytes, f.xxh3});
      continue;
    }
    if (!regions.contains(f.name)) shared.push_back(f.name);
    for (const FileRegion& r : f.regions) regions[f.name].push_back({i, r.offset, r.bytes, r.xxh3});
  }
  for (const std::string& name : shared) {
    std::vector<HashUnit>& file = regions[name];
    std::sort(file.begin(), file.end(),
              [](const HashUnit& a, const HashUnit& b) { return a.offset < b.offset; });
    units.insert(units.end(), file.begin(), file.end());
  }
  return units;
}

std::vector<int> CheckpointReader::Verifiers(const CheckpointManifest& manifest, int count) {
  const std::vector<HashUnit> units = HashUnits(manifest);
  const auto readers = static_cast<uint64_t>(std::max(count, 1));
  std::vector<int> verifier(units.size(), 0);
  std::vector<size_t> whole;
  uint64_t region_bytes = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (manifest.files[units[u].entry].regions.empty()) {
      whole.push_back(u);
    } else {
      region_bytes += units[u].bytes;
    }
  }
  // Whole files: each one's place when ordered by the rank that wrote it.
  for (size_t u : whole) {
    const CheckpointFile& file = manifest.files[units[u].entry];
    uint64_t order = 0;
    for (size_t v : whole) {
      const CheckpointFile& other = manifest.files[units[v].entry];
      order += other.rank < file.rank || (other.rank == file.rank && v < u);
    }
    verifier[u] = static_cast<int>(order * readers / whole.size());
  }
  // Regions: by where their middle falls in the shared files' bytes.
  uint64_t at = 0;
  for (size_t u = 0; u < units.size(); ++u) {
    if (manifest.files[units[u].entry].regions.empty()) continue;
    const uint64_t middle = at + units[u].bytes / 2;
    verifier[u] = static_cast<int>(std::min(readers - 1, middle * readers / region_bytes));
    at += units[u].bytes;
  }
  return verifier;
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

namespace {

// The digest of a hash unit's bytes against what the manifest recorded.
absl::Status CheckDigest(const std::string& path, const CheckpointFile& entry,
                         const CheckpointReader::HashUnit& unit, const FileDigest& digest) {
  if (digest.bytes != unit.bytes) {  // changed since the size check
    return absl::DataLossError(absl::StrCat(path, " ended after ", digest.bytes,
                                            " of the bytes the manifest vouches for (", unit.bytes,
                                            ": truncated or replaced)"));
  }
  if (digest.xxh3 != unit.xxh3) {
    const std::string what =
        entry.regions.empty()
            ? std::string()
            : absl::StrCat(" over bytes [", unit.offset, ", ", unit.offset + unit.bytes,
                           "), which rank ", entry.rank, " wrote");
    return absl::DataLossError(absl::StrCat(path, " fails its checksum", what, ": xxh3 ",
                                            digest.xxh3, ", the manifest recorded ", unit.xxh3,
                                            " (corrupted)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SafetensorsReader*> CheckpointReader::OpenFile(const std::string& file_name,
                                                              bool hash) {
  if (auto it = open_.find(file_name); it != open_.end()) return it->second.get();
  ASSIGN_OR_RETURN(const CheckpointFile* entry, Listed(file_name));
  const std::string path = absl::StrCat(dir_, "/", file_name);
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) {
      return absl::DataLossError(absl::StrCat(path, " is missing (the manifest lists it)"));
    }
    return absl::UnavailableError(absl::StrCat("cannot stat ", path, ": ", ec.message()));
  }
  if (size != entry->bytes) {
    return absl::DataLossError(absl::StrCat(path, " has ", size, " bytes, the manifest recorded ",
                                            entry->bytes, " (truncated or replaced)"));
  }
  if (hash) {
    // The whole file, or each region in order, in one pass.
    const std::vector<size_t>& units = file_units_.at(file_name);
    std::vector<ByteRange> ranges;
    ranges.reserve(units.size());
    for (size_t u : units) ranges.push_back({units_[u].offset, units_[u].bytes});
    ASSIGN_OR_RETURN(std::vector<FileDigest> digests, DigestEachRange(path, ranges));
    for (size_t k = 0; k < units.size(); ++k) {
      const HashUnit& unit = units_[units[k]];
      RETURN_IF_ERROR(CheckDigest(path, manifest_.files[unit.entry], unit, digests[k]));
    }
  }

  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> reader, SafetensorsReader::Open(path));
  SafetensorsReader* raw = reader.get();
  open_[file_name] = std::move(reader);
  return raw;
}

absl::Status CheckpointReader::VerifyAll() {
  for (const CheckpointFile& f : manifest_.files) RETURN_IF_ERROR(File(f.name).status());
  return absl::OkStatus();
}

absl::Status CheckpointReader::VerifyShare(int index, int count) {
  RETURN_IF_ERROR(BeginShare(index, count));
  return FinishShare(/*deliver=*/true);
}

absl::Status CheckpointReader::BeginShare(int index, int count) {
  if (count < 1 || index < 0 || index >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("verifier ", index, " of ", count, " is not a valid share"));
  }
  if (share_begun_) {
    // The first share left other readers' files open unhashed (and, before
    // FinishShare, reads due into its caller's spans): a second would take
    // them as verified.
    return absl::FailedPreconditionError(
        absl::StrCat("a reader of ", dir_, " verifies one share; open another for a second"));
  }
  share_begun_ = true;
  // Files opened before the share were hashed whole when they were opened.
  std::set<std::string> verified;
  for (const auto& [name, file] : open_) verified.insert(name);
  // The share's hash units first (a file, or a region of a file several
  // ranks wrote): one whose file fails its size or header check is hashed at
  // once, so damage is reported as damage, not as whatever its header might
  // say.
  const std::vector<int> verifiers = Verifiers(manifest_, count);
  for (size_t u = 0; u < units_.size(); ++u) {
    const std::string& name = manifest_.files[units_[u].entry].name;
    if (verifiers[u] != index || verified.contains(name)) continue;
    if (!open_.contains(name)) {
      if (absl::StatusOr<SafetensorsReader*> opened = OpenFile(name, /*hash=*/false);
          !opened.ok()) {
        // Checked again, size then hash: a wrong size or a missing file
        // fails as before, a bad header in a damaged file as the damage.
        pending_.clear();  // no reads yet: nothing is left waiting
        RETURN_IF_ERROR(OpenFile(name, /*hash=*/true).status());
        return opened.status();
      }
    }
    pending_[u];
  }
  for (const CheckpointFile& f : manifest_.files) {
    if (absl::Status opened = OpenFile(f.name, /*hash=*/false).status(); !opened.ok()) {
      // Another reader's file is bad: this one's share is still hashed, so
      // damage in it is reported (by this reader) whatever the other says.
      absl::Status own = FinishShare(/*deliver=*/false);
      return own.ok() ? opened : own;
    }
  }
  sharing_ = true;
  return absl::OkStatus();
}

absl::Status CheckpointReader::FinishShare(bool deliver, const std::function<bool()>& stop) {
  absl::Status status;
  for (size_t u = 0; u < units_.size(); ++u) {  // whole files, then the shared ones in order
    if (!pending_.contains(u)) continue;
    // Every unit is hashed even after one failed: the error names the first.
    // Not after a stop: nobody wants the verdict any more.
    absl::Status hashed = HashWhileReading(u, deliver && status.ok(), stop);
    if (status.ok()) status = hashed;
    if (hashed.code() == absl::StatusCode::kAborted) break;
  }
  pending_.clear();
  sharing_ = false;
  std::map<std::string, std::vector<DeferredRead>> late = std::move(late_);
  late_.clear();
  if (!deliver || !status.ok()) return status;
  // What the other readers verify, each file's in file order, now that this
  // reader has streamed its own part: their verifiers stream those parts
  // meanwhile, so these reads mostly find their bytes in the page cache
  // instead of cutting across those streams on the disk.
  for (auto& [file_name, reads] : late) {
    std::sort(reads.begin(), reads.end(),
              [](const DeferredRead& a, const DeferredRead& b) { return a.offset < b.offset; });
    const SafetensorsReader& file = *open_.at(file_name);
    for (const DeferredRead& r : reads) RETURN_IF_ERROR(ReadStoppable(file, r, stop));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadStoppable(const SafetensorsReader& file,
                                             const DeferredRead& read,
                                             const std::function<bool()>& stop) {
  for (size_t k = 0; k < read.out.size(); k += kStopChunk) {
    if (stop && stop()) {
      return absl::AbortedError(
          absl::StrCat("reading ", file.path(), " was aborted at byte ", read.offset + k));
    }
    RETURN_IF_ERROR(file.ReadBytes(
        read.offset + k, read.out.subspan(k, std::min<size_t>(kStopChunk, read.out.size() - k))));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::HashWhileReading(size_t index, bool deliver,
                                                const std::function<bool()>& stop) {
  std::vector<DeferredRead> reads = std::move(pending_.at(index));
  const HashUnit& unit = units_[index];
  const CheckpointFile& entry = manifest_.files[unit.entry];
  SafetensorsReader& file = *open_.at(entry.name);
  std::sort(reads.begin(), reads.end(),
            [](const DeferredRead& a, const DeferredRead& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < reads.size(); ++i) {
    if (reads[i].offset < reads[i - 1].offset + reads[i - 1].out.size()) {
      // Two reads of the same bytes (not what a stage asks): read them as
      // asked, and hash the file on its own.
      if (deliver) {
        for (const DeferredRead& r : reads) RETURN_IF_ERROR(ReadStoppable(file, r, stop));
      }
      reads.clear();
      break;
    }
  }
  if (!deliver) reads.clear();
  // Chunks small enough that the bytes just read are still in the cache
  // when they are hashed.
  constexpr uint64_t kChunk = kStopChunk;
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  XXH3_64bits_reset(state.get());
  std::vector<char> buffer(static_cast<size_t>(std::min(kChunk, unit.bytes)));
  uint64_t at = 0, hashed = 0;
  auto read_into = [&](std::span<char> out) -> absl::Status {
    for (size_t k = 0; k < out.size(); k += kChunk) {
      if (stop && stop()) {
        return absl::AbortedError(absl::StrCat("reading ", file.path(), " was aborted after ",
                                               hashed, " of ", unit.bytes, " bytes"));
      }
      const std::span<char> chunk = out.subspan(k, std::min<size_t>(kChunk, out.size() - k));
      RETURN_IF_ERROR(file.ReadBytes(at, chunk));
      XXH3_64bits_update(state.get(), chunk.data(), chunk.size());
      at += chunk.size();
      hashed += chunk.size();
    }
    return absl::OkStatus();
  };
  auto skip_to = [&](uint64_t to) -> absl::Status {
    while (at < to) {
      RETURN_IF_ERROR(read_into(std::span(buffer).first(std::min<size_t>(buffer.size(), to - at))));
    }
    return absl::OkStatus();
  };
  // The reads were split where the file's hash units meet (ReadPart): each
  // lies in this unit.
  at = unit.offset;
  for (const DeferredRead& r : reads) {
    RETURN_IF_ERROR(skip_to(r.offset));
    RETURN_IF_ERROR(read_into(r.out));
  }
  RETURN_IF_ERROR(skip_to(unit.offset + unit.bytes));
  return CheckDigest(file.path(), entry, unit,
                     FileDigest{hashed, Xxh3Hex(XXH3_64bits_digest(state.get()))});
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
