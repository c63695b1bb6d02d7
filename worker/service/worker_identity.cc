#include "worker/service/worker_identity.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace flatshard {
namespace {

// The seat's contents: its id, or "" for a seat never used.
absl::StatusOr<std::string> ReadId(int fd, const std::string& path) {
  std::string contents(256, '\0');
  const ssize_t n = ::pread(fd, contents.data(), contents.size(), 0);
  if (n < 0) {
    return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", strerror(errno)));
  }
  contents.resize(static_cast<size_t>(n));
  return std::string(absl::StripAsciiWhitespace(contents));
}

absl::Status WriteId(int fd, const std::string& path, const std::string& id) {
  const std::string line = id + "\n";
  if (::ftruncate(fd, 0) != 0 ||
      ::pwrite(fd, line.data(), line.size(), 0) != static_cast<ssize_t>(line.size()) ||
      ::fsync(fd) != 0) {
    return absl::UnavailableError(absl::StrCat("cannot write ", path, ": ", strerror(errno)));
  }
  return absl::OkStatus();
}

std::string FreshId(const std::string& host) {
  std::random_device random;
  return absl::StrFormat("%s-%08x", host, random());
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerIdentity>> WorkerIdentity::Claim(const std::string& dir,
                                                                      const std::string& host,
                                                                      int gpu) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, ": cannot create it: ", ec.message()));
  }
  // A GPU worker has one seat to try; a CPU worker the first free slot.
  const int seats = gpu >= 0 ? 1 : kMaxSlots;
  for (int k = 0; k < seats; ++k) {
    const std::string path =
        absl::StrCat(dir, "/", gpu >= 0 ? absl::StrCat("gpu-", gpu) : absl::StrCat("slot-", k));
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("--state-dir ", dir, ": cannot open ", path, ": ", strerror(errno)));
    }
    if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd);
      if (gpu >= 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("another flatshard-worker drives GPU ", gpu, " (it holds ", path,
                         "); give this one another --gpu or --state-dir"));
      }
      continue;  // a live worker's seat
    }
    absl::StatusOr<std::string> id = ReadId(fd, path);
    if (id.ok() && id->empty()) {
      *id = FreshId(host);
      if (absl::Status written = WriteId(fd, path, *id); !written.ok()) id = written;
    }
    if (!id.ok()) {
      ::close(fd);
      return id.status();
    }
    return std::unique_ptr<WorkerIdentity>(new WorkerIdentity(*std::move(id), path, fd));
  }
  return absl::ResourceExhaustedError(absl::StrCat("--state-dir ", dir, ": all ", kMaxSlots,
                                                   " worker slots are held by live workers"));
}

WorkerIdentity::~WorkerIdentity() { ::close(fd_); }

}  // namespace flatshard
