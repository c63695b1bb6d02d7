#include "storage/durable_file.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "core/status_macros.h"

namespace flatshard {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  const int err = errno;
  const std::string message = absl::StrCat("cannot ", what, " ", path, ": ", std::strerror(err));
  if (err == ENOENT) return absl::NotFoundError(message);
  return absl::UnavailableError(message);
}

}  // namespace

std::string Xxh3Hex(uint64_t hash) { return absl::StrFormat("%016x", hash); }

absl::StatusOr<FileDigest> DigestFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path);
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset(state);
  std::vector<char> buffer(1 << 20);
  FileDigest digest;
  absl::Status status;
  while (true) {
    const ssize_t got = ::read(fd, buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      status = Errno("read", path);
      break;
    }
    if (got == 0) break;
    XXH3_64bits_update(state, buffer.data(), static_cast<size_t>(got));
    digest.bytes += static_cast<uint64_t>(got);
  }
  digest.xxh3 = Xxh3Hex(XXH3_64bits_digest(state));
  XXH3_freeState(state);
  ::close(fd);
  if (!status.ok()) return status;
  return digest;
}

absl::StatusOr<std::vector<FileDigest>> DigestEachRange(const std::string& path,
                                                        const std::vector<ByteRange>& ranges,
                                                        const std::function<bool()>& stop) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path);
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state(XXH3_createState(),
                                                                 &XXH3_freeState);
  std::vector<char> buffer(1 << 20);
  std::vector<FileDigest> digests;
  absl::Status status;
  for (const ByteRange& range : ranges) {
    XXH3_64bits_reset(state.get());
    FileDigest& digest = digests.emplace_back();
    while (digest.bytes < range.bytes && status.ok()) {
      if (stop && stop()) {
        status = absl::AbortedError(
            absl::StrCat("hashing ", path, " was aborted at byte ", range.offset + digest.bytes));
        break;
      }
      const size_t want = std::min<uint64_t>(buffer.size(), range.bytes - digest.bytes);
      const ssize_t got =
          ::pread(fd, buffer.data(), want, static_cast<off_t>(range.offset + digest.bytes));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        status = Errno("read", path);
      } else if (got == 0) {
        status = absl::DataLossError(
            absl::StrCat(path, " ends at byte ", range.offset + digest.bytes, ", inside bytes [",
                         range.offset, ", ", range.offset + range.bytes, ")"));
      } else {
        XXH3_64bits_update(state.get(), buffer.data(), static_cast<size_t>(got));
        digest.bytes += static_cast<uint64_t>(got);
      }
    }
    if (!status.ok()) break;
    digest.xxh3 = Xxh3Hex(XXH3_64bits_digest(state.get()));
  }
  ::close(fd);
  RETURN_IF_ERROR(status);
  return digests;
}

absl::Status FsyncPath(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errno("open", path);
  const int rc = ::fsync(fd);
  absl::Status status = rc == 0 ? absl::OkStatus() : Errno("fsync", path);
  ::close(fd);
  return status;
}

namespace {

// A directory a private file may be written into: its owner's (or root's),
// and not one every user may add or replace files in (a sticky directory,
// /tmp, lets them add but neither replace nor remove ours). Writable by its
// group is allowed: umask 002 makes every directory so where each user has
// a group of their own (Debian, Ubuntu, Fedora).
absl::Status CheckPrivateDirectory(const std::string& dir, const std::string& path) {
  struct stat info = {};
  if (::stat(dir.c_str(), &info) != 0) return Errno("stat", dir);
  if (info.st_uid != ::geteuid() && info.st_uid != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("will not write ", path, ": its directory ", dir, " belongs to uid ",
                     info.st_uid, ", not to this process's uid ", ::geteuid(),
                     ", who could read or replace the secret it keeps"));
  }
  if ((info.st_mode & S_IWOTH) != 0 && (info.st_mode & S_ISVTX) == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "will not write %s: its directory %s is writable by every user (mode %04o), who could "
        "replace the secret it keeps; make it 0700 or 0755",
        path, dir, info.st_mode & 07777));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status WriteFileDurably(const std::string& path, absl::string_view contents, mode_t mode) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  if (parent.empty()) parent = ".";
  if ((mode & 077) == 0) RETURN_IF_ERROR(CheckPrivateDirectory(parent, path));
  const std::string tmp = path + ".tmp";
  // A new file, never an existing one or through a link: a file already
  // there (left by a crash, or made by someone else to keep its own owner
  // and mode, or linking elsewhere) is removed first.
  constexpr int kCreateNew = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC;
  int fd = ::open(tmp.c_str(), kCreateNew, mode);
  if (fd < 0 && errno == EEXIST) {
    if (::unlink(tmp.c_str()) != 0 && errno != ENOENT) return Errno("remove the stale", tmp);
    fd = ::open(tmp.c_str(), kCreateNew, mode);
  }
  if (fd < 0) return Errno("create", tmp);
  const char* data = contents.data();
  size_t left = contents.size();
  while (left > 0) {
    const ssize_t wrote = ::write(fd, data, left);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote < 0) {
      absl::Status status = Errno("write", tmp);
      ::close(fd);
      ::unlink(tmp.c_str());
      return status;
    }
    data += wrote;
    left -= static_cast<size_t>(wrote);
  }
  if (::fsync(fd) != 0) {
    absl::Status status = Errno("fsync", tmp);
    ::close(fd);
    ::unlink(tmp.c_str());
    return status;
  }
  ::close(fd);
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status status = Errno("rename into place", path);
    ::unlink(tmp.c_str());
    return status;
  }
  return FsyncPath(parent);
}

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return std::filesystem::exists(path)
               ? absl::UnavailableError(absl::StrCat("cannot read ", path))
               : absl::NotFoundError(absl::StrCat(path, " does not exist"));
  }
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

}  // namespace flatshard
