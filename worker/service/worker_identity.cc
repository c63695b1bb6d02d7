#include "worker/service/worker_identity.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <random>
#include <utility>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/secrets.h"

namespace flatshard {
namespace {

struct Seat {
  std::string id;      // "" for a seat never used
  std::string secret;  // "" for a seat written before identity secrets
};

// The seat's contents: "<id>\n<identity secret>\n".
absl::StatusOr<Seat> ReadSeat(int fd, const std::string& path) {
  std::string contents(512, '\0');
  const ssize_t n = ::pread(fd, contents.data(), contents.size(), 0);
  if (n < 0) {
    return absl::UnavailableError(absl::StrCat("cannot read ", path, ": ", strerror(errno)));
  }
  contents.resize(static_cast<size_t>(n));
  Seat seat;
  const size_t newline = contents.find('\n');
  seat.id = std::string(absl::StripAsciiWhitespace(contents.substr(0, newline)));
  if (newline != std::string::npos) {
    seat.secret = std::string(absl::StripAsciiWhitespace(contents.substr(newline + 1)));
  }
  return seat;
}

// Owner-only: the secret proves this worker's identity to the coordinator.
absl::Status WriteSeat(int fd, const std::string& path, const Seat& seat) {
  const std::string line = absl::StrCat(seat.id, "\n", seat.secret, "\n");
  if (::fchmod(fd, 0600) != 0 || ::ftruncate(fd, 0) != 0 ||
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
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
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
    absl::StatusOr<Seat> seat = ReadSeat(fd, path);
    if (seat.ok() && (seat->id.empty() || seat->secret.empty())) {
      if (seat->id.empty()) seat->id = FreshId(host);
      seat->secret = RandomSecret();
      if (absl::Status written = WriteSeat(fd, path, *seat); !written.ok()) seat = written;
    }
    if (!seat.ok()) {
      ::close(fd);
      return seat.status();
    }
    return std::unique_ptr<WorkerIdentity>(
        new WorkerIdentity(std::move(seat->id), std::move(seat->secret), path, fd));
  }
  return absl::ResourceExhaustedError(absl::StrCat("--state-dir ", dir, ": all ", kMaxSlots,
                                                   " worker slots are held by live workers"));
}

WorkerIdentity::~WorkerIdentity() { ::close(fd_); }

}  // namespace flatshard
