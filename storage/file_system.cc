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
      if (at_ - writeback_from_ >= kWritebackBytes) StartWriteback();
    }
    return absl::OkStatus();
  }
  absl::Status Seek(uint64_t offset) override {
    // A shared file's writer leaves a region for its next one: the writeback
    // of what it wrote since it last started one starts now, so the range
    // never spans the other writers' bytes (their own writers start them).
    if (static_cast<off_t>(offset) == at_) return absl::OkStatus();
    StartWriteback();  // does nothing when nothing is unstarted
    at_ = static_cast<off_t>(offset);
    writeback_from_ = at_;
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
  // Asks the kernel to start writing [writeback_from_, at_) and returns
  // without waiting for that; first, while more than kMaxWritebackInFlight
  // would be in writeback, waits for the oldest started range to be
  // written. A pacing hint only: Sync's fsync is what makes the file durable
  // and reports any write error, so a failure here is not one.
  void StartWriteback() {
    const off_t length = at_ - writeback_from_;
    // Never a zero length: to sync_file_range that means "to the end of the
    // file", another writer's regions of a shared file included.
    if (length <= 0) return;
    while (!in_flight_.empty() && in_flight_bytes_ + length > kMaxWritebackInFlight) {
      const auto [from, started] = in_flight_.front();
      // Range by range: a shared file's other writers' regions lie between.
#ifdef __linux__
      (void)::sync_file_range(
          fd_, from, started,
          SYNC_FILE_RANGE_WAIT_BEFORE | SYNC_FILE_RANGE_WRITE | SYNC_FILE_RANGE_WAIT_AFTER);
#endif
      in_flight_bytes_ -= started;
      in_flight_.pop_front();
    }
#ifdef __linux__
    (void)::sync_file_range(fd_, writeback_from_, length, SYNC_FILE_RANGE_WRITE);
#endif
    in_flight_.emplace_back(writeback_from_, length);
    in_flight_bytes_ += length;
    writeback_from_ = at_;
  }

  std::string path_;
  int fd_;
  off_t at_ = 0;              // where the next Append writes
  off_t writeback_from_ = 0;  // where the bytes whose writeback is not started begin
  // The ranges whose writeback was started and not yet waited for, oldest
  // first (offset, length), and their bytes.
  std::deque<std::pair<off_t, off_t>> in_flight_;
  off_t in_flight_bytes_ = 0;
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
