// The file operations checkpoint writers use, behind an interface (LevelDB's
// Env is the model), so that tests and the fault-injection suite can make a
// disk fill up, fail or crash a process at a chosen point of a real save
// without touching the production write path. FileSystem::Default() is POSIX.
#ifndef FLATSHARD_STORAGE_FILE_SYSTEM_H_
#define FLATSHARD_STORAGE_FILE_SYSTEM_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flatshard {

// How the real (POSIX) files pace their writeback.
// How much a file may hold unwritten before its writeback is started: the
// disk then works while the writer produces the next bytes (a checkpoint
// save exchanges the next tensor meanwhile) instead of all at the final
// fsync. RocksDB's bytes_per_sync is the same idea.
inline constexpr uint64_t kWritebackWindowBytes = uint64_t{8} << 20;
// How much a file may have in writeback before its writer waits for the
// oldest of it (RocksDB's strict_bytes_per_sync, with a deeper queue): the
// writer then moves at the disk's pace, and the final fsync has at most this
// much plus one window left to write, however much memory the host has for
// dirty pages. Without it, a host with a terabyte of RAM saving to a slow
// mount buffered everything and sat in one fsync for minutes, with no
// progress a stall watcher could see (docs/fault-tolerance.md, "Stalled
// ranks"). A single window in flight cost FULL and SHARDED saves 5-20%
// here (their writers gather the next tensor while the disk writes); at
// 64 MiB the saves measured within this VM's noise (bench/RESULTS.md,
// 2026-11-30).
inline constexpr uint64_t kMaxWritebackInFlightBytes = uint64_t{64} << 20;

// A file being written, from the start or (OpenSharedFile) at offsets the
// writer seeks to. Errors are UNAVAILABLE (the disk or the OS refused) naming
// the path and the OS's reason.
class WritableFile {
 public:
  virtual ~WritableFile() = default;  // closes (without syncing)
  // All of `data`, or an error (a short write is retried, then reported).
  virtual absl::Status Append(absl::string_view data) = 0;
  // The next Append writes at `offset`.
  virtual absl::Status Seek(uint64_t offset) = 0;
  virtual absl::Status Sync() = 0;  // fsync
  virtual absl::Status Close() = 0;
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;
  // Creates `path`: ALREADY_EXISTS if it exists, UNAVAILABLE otherwise.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> NewWritableFile(
      const std::string& path) = 0;
  // Opens `path` for writing at chosen offsets, creating it if it is not
  // there, `size` bytes long (a hole until written): a file several processes
  // write at once, each its own byte ranges, so none creates it exclusively
  // or truncates it.
  virtual absl::StatusOr<std::unique_ptr<WritableFile>> OpenSharedFile(const std::string& path,
                                                                       uint64_t size) = 0;
  virtual absl::Status RemoveFile(const std::string& path) = 0;

  // The real one (POSIX); lives for the whole process.
  static FileSystem* Default();
};

}  // namespace flatshard

#endif  // FLATSHARD_STORAGE_FILE_SYSTEM_H_
