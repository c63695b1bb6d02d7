// A FileSystem that fails on purpose (tests, the fault-injection suite, and
// flatshard-worker --inject-file-faults): for files whose path contains a
// given substring it fills the disk (a short write, then ENOSPC) after a number
// of bytes, fails fsync with EIO, kills the process (SIGKILL, no cleanup) or
// blocks for good once a number of bytes were written (by this process: a
// file several processes write counts each one's bytes), or makes every write
// take longer (a slow disk that still moves). Everything else goes to the
// wrapped file system unchanged.
#ifndef FLATSHARD_STORAGE_FAULT_INJECTING_FILE_SYSTEM_H_
#define FLATSHARD_STORAGE_FAULT_INJECTING_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "storage/file_system.h"

namespace flatshard {

struct FileFault {
  enum class Kind { kDiskFull, kSyncError, kCrash, kHang, kSlow };
  Kind kind = Kind::kDiskFull;
  std::string path_contains;  // which files
  uint64_t after_bytes = 0;   // disk full / crash / hang once this many bytes are in the file
  absl::Duration delay = absl::ZeroDuration();  // slow: how much longer each write takes
};

// "disk-full:SUBSTRING[:BYTES]", "sync-error:SUBSTRING", "crash:SUBSTRING[:BYTES]",
// "hang:SUBSTRING[:BYTES]", "slow:SUBSTRING:MS";
// several separated by commas. INVALID_ARGUMENT naming the bad part.
absl::StatusOr<std::vector<FileFault>> ParseFileFaults(const std::string& spec);

class FaultInjectingFileSystem : public FileSystem {
 public:
  FaultInjectingFileSystem(FileSystem* base, std::vector<FileFault> faults)
      : base_(base), faults_(std::move(faults)) {}

  absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<WritableFile>> OpenSharedFile(const std::string& path,
                                                               uint64_t size) override;
  absl::Status RemoveFile(const std::string& path) override { return base_->RemoveFile(path); }

 private:
  // `file` with the faults that name `path`, if any.
  std::unique_ptr<WritableFile> Wrap(std::unique_ptr<WritableFile> file,
                                     const std::string& path) const;

  FileSystem* base_;
  std::vector<FileFault> faults_;
};

}  // namespace flatshard

#endif  // FLATSHARD_STORAGE_FAULT_INJECTING_FILE_SYSTEM_H_
