#include "storage/safetensors_file_writer.h"

#include <utility>

#include <xxhash.h>

#include "absl/strings/str_cat.h"

#include "core/model_spec.h"
#include "core/status_macros.h"

namespace flatshard {

SafetensorsFileWriter::SafetensorsFileWriter(std::string path, FileSystem* fs,
                                             std::unique_ptr<WritableFile> file,
                                             std::vector<SafetensorsSlot> slots)
    : path_(std::move(path)),
      fs_(fs),
      file_(std::move(file)),
      slots_(std::move(slots)),
      hash_(XXH3_createState()) {
  XXH3_64bits_reset(hash_);
}

SafetensorsFileWriter::~SafetensorsFileWriter() {
  file_.reset();
  if (!finished_) (void)fs_->RemoveFile(path_);
  XXH3_freeState(hash_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> SafetensorsFileWriter::Create(
    const std::string& path, std::vector<SafetensorsSlot> slots,
    const std::map<std::string, std::string>& metadata, FileSystem* fs) {
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(slots, metadata);
  if (!header.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", header.status().message()));
  }
  if (fs == nullptr) fs = FileSystem::Default();
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, fs->NewWritableFile(path));
  std::unique_ptr<SafetensorsFileWriter> writer(
      new SafetensorsFileWriter(path, fs, std::move(file), std::move(slots)));
  RETURN_IF_ERROR(writer->Write(header->data(), header->size()));
  return writer;
}

absl::Status SafetensorsFileWriter::Write(const char* data, size_t size) {
  XXH3_64bits_update(hash_, data, size);
  bytes_ += size;
  return file_->Append(absl::string_view(data, size));
}

absl::Status SafetensorsFileWriter::Append(absl::string_view name, std::span<const float> values) {
  if (next_ >= slots_.size() || slots_[next_].name != name) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor '", name, "' appended out of order; expected '",
        next_ < slots_.size() ? slots_[next_].name : "<none>", "'",
        next_written_ > 0 ? absl::StrCat(" (", next_written_, " of its elements written)") : ""));
  }
  const SafetensorsSlot& slot = slots_[next_];
  const auto numel = static_cast<uint64_t>(NumElements(slot.shape));
  if (values.size() > numel - next_written_) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", name, "' got ", values.size(), " elements, ",
                     numel - next_written_, " of its shape's ", numel, " remain to be written"));
  }
  next_written_ += values.size();
  if (next_written_ == numel) {
    ++next_;
    next_written_ = 0;
  }
  if (slot.dtype == DType::kFloat32) {
    return Write(reinterpret_cast<const char*>(values.data()), values.size_bytes());
  }
  std::string converted(values.size() * DTypeSize(slot.dtype), '\0');
  ConvertElements(DType::kFloat32, reinterpret_cast<const std::byte*>(values.data()), slot.dtype,
                  reinterpret_cast<std::byte*>(converted.data()), values.size());
  return Write(converted.data(), converted.size());
}

absl::StatusOr<FileDigest> SafetensorsFileWriter::Finish() {
  if (next_ != slots_.size()) {
    return absl::FailedPreconditionError(
        absl::StrCat(path_, ": ", slots_.size() - next_,
                     " tensors were never written whole, the first '", slots_[next_].name, "'"));
  }
  RETURN_IF_ERROR(file_->Sync());
  RETURN_IF_ERROR(file_->Close());
  finished_ = true;
  return FileDigest{bytes_, Xxh3Hex(XXH3_64bits_digest(hash_))};
}

absl::Status WriteSafetensorsFile(const std::string& path,
                                  const std::map<std::string, SafetensorsTensor>& tensors,
                                  const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> bytes = SerializeSafetensors(tensors, metadata);
  if (!bytes.ok()) return bytes.status();
  // A summoned model is often the only copy a user keeps: a crash must leave
  // the old file or the whole new one, never a renamed but unwritten one.
  return WriteFileDurably(path, *bytes);
}

}  // namespace flatshard
