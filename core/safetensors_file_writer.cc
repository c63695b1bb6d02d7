#include "core/safetensors_file_writer.h"

#include <cerrno>
#include <cstring>
#include <utility>

#include <fcntl.h>
#include <unistd.h>
#include <xxhash.h>

#include "absl/strings/str_cat.h"

#include "core/model_spec.h"
#include "core/status_macros.h"

namespace flatshard {

SafetensorsFileWriter::SafetensorsFileWriter(std::string path, int fd,
                                             std::vector<SafetensorsSlot> slots)
    : path_(std::move(path)), fd_(fd), slots_(std::move(slots)), hash_(XXH3_createState()) {
  XXH3_64bits_reset(hash_);
}

SafetensorsFileWriter::~SafetensorsFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!finished_) ::unlink(path_.c_str());
  XXH3_freeState(hash_);
}

absl::StatusOr<std::unique_ptr<SafetensorsFileWriter>> SafetensorsFileWriter::Create(
    const std::string& path, std::vector<SafetensorsSlot> slots,
    const std::map<std::string, std::string>& metadata) {
  absl::StatusOr<std::string> header = EncodeSafetensorsHeader(slots, metadata);
  if (!header.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", header.status().message()));
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    const int err = errno;
    const std::string message = absl::StrCat("cannot create ", path, ": ", std::strerror(err));
    return err == EEXIST ? absl::AlreadyExistsError(message) : absl::UnavailableError(message);
  }
  std::unique_ptr<SafetensorsFileWriter> writer(
      new SafetensorsFileWriter(path, fd, std::move(slots)));
  RETURN_IF_ERROR(writer->Write(header->data(), header->size()));
  return writer;
}

absl::Status SafetensorsFileWriter::Write(const char* data, size_t size) {
  XXH3_64bits_update(hash_, data, size);
  bytes_ += size;
  while (size > 0) {
    const ssize_t wrote = ::write(fd_, data, size);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot write ", path_, ": ", std::strerror(errno)));
    }
    data += wrote;
    size -= static_cast<size_t>(wrote);
  }
  return absl::OkStatus();
}

absl::Status SafetensorsFileWriter::Append(absl::string_view name, std::span<const float> values) {
  if (next_ >= slots_.size() || slots_[next_].name != name) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": tensor '", name, "' appended out of order; expected '",
                     next_ < slots_.size() ? slots_[next_].name : "<none>", "'"));
  }
  const SafetensorsSlot& slot = slots_[next_];
  const auto numel = static_cast<size_t>(NumElements(slot.shape));
  if (values.size() != numel) {
    return absl::InvalidArgumentError(absl::StrCat(
        path_, ": tensor '", name, "' got ", values.size(), " elements, its shape holds ", numel));
  }
  ++next_;
  if (slot.dtype == DType::kFloat32) {
    return Write(reinterpret_cast<const char*>(values.data()), values.size_bytes());
  }
  std::string converted(numel * DTypeSize(slot.dtype), '\0');
  ConvertElements(DType::kFloat32, reinterpret_cast<const std::byte*>(values.data()), slot.dtype,
                  reinterpret_cast<std::byte*>(converted.data()), numel);
  return Write(converted.data(), converted.size());
}

absl::StatusOr<FileDigest> SafetensorsFileWriter::Finish() {
  if (next_ != slots_.size()) {
    return absl::FailedPreconditionError(absl::StrCat(path_, ": ", slots_.size() - next_,
                                                      " tensors were never written, the first '",
                                                      slots_[next_].name, "'"));
  }
  if (::fsync(fd_) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot fsync ", path_, ": ", std::strerror(errno)));
  }
  ::close(fd_);
  fd_ = -1;
  finished_ = true;
  return FileDigest{bytes_, Xxh3Hex(XXH3_64bits_digest(hash_))};
}

}  // namespace flatshard
