// Files that survive a crash: written through a descriptor that is fsynced
// before it is closed, renamed into place, and the directory fsynced after, so
// after a power cut a reader sees either the old state or the whole new file.
// Checksums are XXH3-64 over the whole file, written as 16 lowercase hex
// digits, the form checkpoint manifests record.
#ifndef FLATSHARD_STORAGE_DURABLE_FILE_H_
#define FLATSHARD_STORAGE_DURABLE_FILE_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <sys/types.h>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace flatshard {

struct FileDigest {
  uint64_t bytes = 0;
  std::string xxh3;  // 16 hex digits
};

struct ByteRange {
  uint64_t offset = 0;
  uint64_t bytes = 0;
  bool operator==(const ByteRange&) const = default;
};

std::string Xxh3Hex(uint64_t hash);

// XXH3-64 of the file's contents, read sequentially. NOT_FOUND when absent.
absl::StatusOr<FileDigest> DigestFile(const std::string& path);
// XXH3-64 of each of `ranges` (one digest each, in the order given; `bytes`
// the range's length), the file opened once. DATA_LOSS when the file ends
// before a range does. `stop` (if set) is asked before each MiB: ABORTED
// once it answers true.
absl::StatusOr<std::vector<FileDigest>> DigestEachRange(const std::string& path,
                                                        const std::vector<ByteRange>& ranges,
                                                        const std::function<bool()>& stop = {});

// fsync on a file or directory (directories make renames and creations in
// them durable).
absl::Status FsyncPath(const std::string& path);

// Writes `contents` to `path` atomically: `path`.tmp, fsync, rename, fsync of
// the parent directory. The file gets `mode` (less the umask) from its
// creation on. `path`.tmp is always created new (O_EXCL, not through a
// link; one already there is removed first), so a file someone else left
// there cannot keep its owner and mode for the contents. A private file (no
// group or other bits in `mode`: keys, tokens) is written only into a
// directory of this user's (or root's) that not every user may write to:
// FAILED_PRECONDITION naming it otherwise.
absl::Status WriteFileDurably(const std::string& path, absl::string_view contents,
                              mode_t mode = 0644);

absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace flatshard

#endif  // FLATSHARD_STORAGE_DURABLE_FILE_H_
