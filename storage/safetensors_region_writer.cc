#include "storage/safetensors_region_writer.h"

#include <utility>

#include <xxhash.h>

#include "absl/strings/str_cat.h"

#include "core/model_spec.h"
#include "core/status_macros.h"

namespace flatshard {

SafetensorsRegionWriter::SafetensorsRegionWriter(std::string path,
                                                 std::unique_ptr<WritableFile> file,
                                                 std::map<std::string, Slot, std::less<>> slots,
                                                 uint64_t file_bytes)
    : path_(std::move(path)),
      file_(std::move(file)),
      slots_(std::move(slots)),
      hash_(XXH3_createState()) {
  written_.file_bytes = file_bytes;
  XXH3_64bits_reset(hash_);
}

SafetensorsRegionWriter::~SafetensorsRegionWriter() { XXH3_freeState(hash_); }

absl::StatusOr<std::unique_ptr<SafetensorsRegionWriter>> SafetensorsRegionWriter::Open(
    const std::string& path, const std::vector<SafetensorsSlot>& slots,
    const std::map<std::string, std::string>& metadata, bool writes_header, FileSystem* fs) {
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(slots, metadata);
  if (!header.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", header.status().message()));
  }
  // The header lays the slots' data out contiguously, in order, after it.
  std::map<std::string, Slot, std::less<>> layout;
  uint64_t at = header->size();
  for (const SafetensorsSlot& s : slots) {
    const auto numel = static_cast<uint64_t>(NumElements(s.shape));
    layout[s.name] = {at, numel, s.dtype};
    at += numel * DTypeSize(s.dtype);
  }
  if (fs == nullptr) fs = FileSystem::Default();
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->OpenSharedFile(path, at));
  std::unique_ptr<SafetensorsRegionWriter> writer(
      new SafetensorsRegionWriter(path, std::move(file), std::move(layout), at));
  if (writes_header) RETURN_IF_ERROR(writer->WriteAt(0, header->data(), header->size()));
  return writer;
}

absl::Status SafetensorsRegionWriter::WriteAt(uint64_t offset, const char* data, size_t size) {
  std::vector<FileRegion>& regions = written_.regions;
  const uint64_t end = regions.empty() ? 0 : regions.back().offset + regions.back().bytes;
  if (!regions.empty() && offset < end) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": a write at byte ", offset, " comes behind one that ended at ", end));
  }
  if (size == 0) return absl::OkStatus();
  if (regions.empty() || offset != end) {
    CloseRegion();
    RETURN_IF_ERROR(file_->Seek(offset));
    regions.push_back({offset, 0, ""});
  }
  XXH3_64bits_update(hash_, data, size);
  regions.back().bytes += size;
  return file_->Append(absl::string_view(data, size));
}

void SafetensorsRegionWriter::CloseRegion() {
  if (written_.regions.empty() || !written_.regions.back().xxh3.empty()) return;
  written_.regions.back().xxh3 = Xxh3Hex(XXH3_64bits_digest(hash_));
  XXH3_64bits_reset(hash_);
}

absl::Status SafetensorsRegionWriter::Write(absl::string_view name, uint64_t begin,
                                            std::span<const float> values) {
  auto it = slots_.find(name);
  if (it == slots_.end()) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": no tensor '", name, "'"));
  }
  const Slot& slot = it->second;
  if (begin > slot.numel || values.size() > slot.numel - begin) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": elements [", begin, ", ",
                                                   begin + values.size(), ") of '", name,
                                                   "' are outside its ", slot.numel));
  }
  const size_t size = DTypeSize(slot.dtype);
  const uint64_t offset = slot.offset + begin * size;
  if (slot.dtype == DType::kFloat32) {
    return WriteAt(offset, reinterpret_cast<const char*>(values.data()), values.size_bytes());
  }
  std::string converted(values.size() * size, '\0');
  ConvertElements(DType::kFloat32, reinterpret_cast<const std::byte*>(values.data()), slot.dtype,
                  reinterpret_cast<std::byte*>(converted.data()), values.size());
  return WriteAt(offset, converted.data(), converted.size());
}

absl::StatusOr<SafetensorsRegionWriter::Written> SafetensorsRegionWriter::Finish() {
  CloseRegion();
  RETURN_IF_ERROR(file_->Sync());
  RETURN_IF_ERROR(file_->Close());
  return written_;
}

}  // namespace flatshard
