#include "storage/file_system.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <utility>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard {
namespace {

constexpr auto kWritebackBytes = static_cast<off_t>(kWritebackWindowBytes);
constexpr auto kMaxWritebackInFlight = static_cast<off_t>(kMaxWritebackInFlightBytes);

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
    // A window at a time, so that a big append (a converter's whole tensor)
    // is paced like many small ones.
    while (!data.empty()) {
      const size_t piece = std::min(data.size(), static_cast<size_t>(kWritebackBytes));
      const ssize_t wrote = ::pwrite(fd_, data.data(), piece, at_);
      if (wrote < 0 && errno == EINTR) continue;
      if (wrote < 0) return OsError("write", path_, errno);
      data.remove_prefix(static_cast<size_t>(wrote));
      at_ += wrote;
      if (at_ - writeback_from_ >= kWritebackBytes) RETURN_IF_ERROR(StartWriteback());
    }
    return absl::OkStatus();
  }
  absl::Status Seek(uint64_t offset) override {
    // A shared file's writer leaves a region for its next one: the writeback
    // of what it wrote since it last started one starts now, so the range
    // never spans the other writers' bytes (their own writers start them).
    if (static_cast<off_t>(offset) == at_) return absl::OkStatus();
    RETURN_IF_ERROR(StartWriteback());  // does nothing when nothing is unstarted
    at_ = static_cast<off_t>(offset);
    writeback_from_ = at_;
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    // A writeback error seen while pacing is reported once, to whoever asked
    // then; it stays the file's error for a caller that went on regardless.
    if (!write_error_.ok()) return write_error_;
    return ::fsync(fd_) == 0 ? absl::OkStatus() : OsError("fsync", path_, errno);
  }
  absl::Status Close() override {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0 ? absl::OkStatus() : OsError("close", path_, errno);
  }

 private:
  // Asks the kernel to start writing [writeback_from_, at_) and returns
  // without waiting for that; first, while more than kMaxWritebackInFlight
  // would be in writeback, waits for the oldest started range to be
  // written.
  //
  // A pacing hint, but not one whose errors may be dropped: the wait reports
  // a failed writeback of the range (EIO, ENOSPC on a thin or network
  // volume) and, since Linux 4.13, marks it reported to this descriptor
  // (errseq), and the failed pages are left clean. The final fsync then
  // finds nothing to write and returns 0: a file that lost bytes would be
  // committed as durable (PostgreSQL's "fsyncgate"). So a failure here is
  // the file's write error, returned now and by Sync.
  absl::Status StartWriteback() {
    if (!write_error_.ok()) return write_error_;
    const off_t length = at_ - writeback_from_;
    // Never a zero length: to sync_file_range that means "to the end of the
    // file", another writer's regions of a shared file included.
    if (length <= 0) return absl::OkStatus();
    while (!in_flight_.empty() && in_flight_bytes_ + length > kMaxWritebackInFlight) {
      const auto [from, started] = in_flight_.front();
      // Range by range: a shared file's other writers' regions lie between.
      RETURN_IF_ERROR(SyncFileRange(
          from, started,
          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER));
      in_flight_bytes_ -= started;
      in_flight_.pop_front();
    }
    RETURN_IF_ERROR(SyncFileRange(writeback_from_, length, SYNC_FILE_RANGE_WRITE));
    in_flight_.emplace_back(writeback_from_, length);
    in_flight_bytes_ += length;
    writeback_from_ = at_;
    return absl::OkStatus();
  }

  // sync_file_range(2) over [from, from + length), its error kept as the
  // file's. A file system that does not do it (EINVAL, ENOSYS, ESPIPE) is
  // not paced, and that is no error: fsync alone then reports them.
  absl::Status SyncFileRange(off_t from, off_t length, unsigned int flags) {
    if (::sync_file_range(fd_, from, length, flags) == 0) return absl::OkStatus();
    const int err = errno;
    if (err == EINVAL || err == ENOSYS || err == ESPIPE) return absl::OkStatus();
    write_error_ = OsError("write back", path_, err);
    return write_error_;
  }

  std::string path_;
  int fd_;
  off_t at_ = 0;              // where the next Append writes
  off_t writeback_from_ = 0;  // where the bytes whose writeback is not started begin
  // The ranges whose writeback was started and not yet waited for, oldest
  // first (offset, length), and their bytes.
  std::deque<std::pair<off_t, off_t>> in_flight_;
  off_t in_flight_bytes_ = 0;
  absl::Status write_error_;  // the first writeback error (StartWriteback)
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
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenSharedFile(const std::string& path,
                                                               uint64_t size) override {
    const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return OsError("open", path, errno);
    // Every writer sets the same size, so whoever comes first makes it and
    // the rest change nothing (a hole reads as zeros until its writer fills it).
    struct stat info = {};
    if (::fstat(fd, &info) != 0 || (static_cast<uint64_t>(info.st_size) < size &&
                                    ::ftruncate(fd, static_cast<off_t>(size)) != 0)) {
      const int err = errno;
      ::close(fd);
      return OsError("size", path, err);
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
