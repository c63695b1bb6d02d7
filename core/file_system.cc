#include "core/file_system.h"

#include <cerrno>
#include <cstring>

#include <fcntl.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

// How much a file may hold unwritten before its writeback is started: the
// disk then works while the writer produces the next bytes (a checkpoint
// save exchanges the next tensor meanwhile) instead of all at the final
// fsync. RocksDB's bytes_per_sync is the same idea.
constexpr off_t kWritebackBytes = off_t{8} << 20;

absl::Status OsError(const std::string& what, const std::string& path, int err) {
  return absl::UnavailableError(absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(err)));
}

class PosixWritableFile : public WritableFile {
 public:
  PosixWritableFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixWritableFile() override {
    if (fd_ >= 0) ::close(fd_);
  }
  PosixWritableFile(const PosixWritableFile&) = delete;
  PosixWritableFile& operator=(const PosixWritableFile&) = delete;

  absl::Status Append(absl::string_view data) override {
    while (!data.empty()) {
      const ssize_t wrote = ::write(fd_, data.data(), data.size());
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote < 0) return OsError("write", path_, errno);
      data.remove_prefix(static_cast<size_t>(wrote));
      written_ += wrote;
    }
    if (written_ - writeback_from_ >= kWritebackBytes) StartWriteback();
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    return ::fsync(fd_) == 0 ? absl::OkStatus() : OsError("fsync", path_, errno);
  }
  absl::Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0 ? absl::OkStatus() : OsError("close", path_, errno);
  }

 private:
  // Asks the kernel to start writing [writeback_from_, written_) to the disk
  // and returns at once. A hint only: Sync's fsync is what makes the file
  // durable and reports any write error, so a failure here is not one.
  void StartWriteback() {
#ifdef __linux__
    (void)::sync_file_range(fd_, writeback_from_, written_ - writeback_from_,
                            SYNC_FILE_RANGE_WRITE);
#endif
    writeback_from_ = written_;
  }

  std::string path_;
  int fd_;
  off_t written_ = 0;
  off_t writeback_from_ = 0;
};

class PosixFileSystem : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      const int err = errno;
      const absl::Status status = OsError("create", path, err);
      return err == EEXIST ? absl::AlreadyExistsError(status.message()) : status;
    }
    return std::make_unique<PosixWritableFile>(path, fd);
  }
  absl::Status RemoveFile(const std::string& path) override {
    return ::unlink(path.c_str()) == 0 || errno == ENOENT ? absl::OkStatus()
                                                          : OsError("remove", path, errno);
  }
};

}  // namespace

FileSystem* FileSystem::Default() {
  static FileSystem* const posix = new PosixFileSystem();  // never destroyed: used at exit
  return posix;
}

}  // namespace flatshard
