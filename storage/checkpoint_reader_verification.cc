// CheckpointReader's verification: which reader hashes which part of a
// checkpoint (HashUnits, Verifiers), the files opened with their digests
// checked, and a share's hashing folded into the reads that stage it
// (BeginShare, FinishShare). The reads themselves: checkpoint_reader.cc.
#include <algorithm>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <system_error>
#include <vector>

#include <xxhash.h>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "storage/checkpoint_reader.h"
#include "storage/durable_file.h"

namespace flatshard {

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
                                                              bool hash,
                                                              const std::function<bool()>& stop) {
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
    ASSIGN_OR_RETURN(std::vector<FileDigest> digests, DigestEachRange(path, ranges, stop));
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

absl::Status CheckpointReader::BeginShare(int index, int count, const std::function<bool()>& stop) {
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
        RETURN_IF_ERROR(OpenFile(name, /*hash=*/true, stop).status());
        return opened.status();
      }
    }
    pending_[u];
  }
  for (const CheckpointFile& f : manifest_.files) {
    if (absl::Status opened = OpenFile(f.name, /*hash=*/false).status(); !opened.ok()) {
      // Another reader's file is bad: this one's share is still hashed, so
      // damage in it is reported (by this reader) whatever the other says.
      absl::Status own = FinishShare(/*deliver=*/false, stop);
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

}  // namespace flatshard
