#include "worker/service/worker_identity.h"

#include <algorithm>
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
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "rpc/secrets.h"

#include "core/status_macros.h"

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

absl::Status CreateStateDir(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, ": cannot create it: ", ec.message()));
  }
  return absl::OkStatus();
}

// A given id's seat file: "id-" and the id, with every byte outside
// [A-Za-z0-9._-] written as %XX so that any id makes one file name; an id
// too long for a file name by its SHA-256 instead (the file holds the id,
// which the claim checks).
std::string IdSeatName(const std::string& id) {
  std::string name = "id-";
  for (const char c : id) {
    if (absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-') {
      name += c;
    } else {
      absl::StrAppendFormat(&name, "%%%02X", static_cast<unsigned char>(c));
    }
  }
  constexpr size_t kMaxName = 200;  // NAME_MAX is 255 on Linux file systems
  // "idsha256-", not "id-...": no id's own name can be a hashed one.
  return name.size() <= kMaxName ? name : absl::StrCat("idsha256-", Sha256Hex(id));
}

}  // namespace

absl::StatusOr<std::unique_ptr<WorkerIdentity>> WorkerIdentity::Claim(const std::string& dir,
                                                                      const std::string& host,
                                                                      int gpu) {
  RETURN_IF_ERROR(CreateStateDir(dir));
  // A GPU worker has one seat to try; a CPU worker the first free slot.
  const int seats = gpu >= 0 ? 1 : kMaxSlots;
  for (int k = 0; k < seats; ++k) {
    const std::string path =
        absl::StrCat(dir, "/", gpu >= 0 ? absl::StrCat("gpu-", gpu) : absl::StrCat("slot-", k));
    ASSIGN_OR_RETURN(std::unique_ptr<WorkerIdentity> identity, TakeSeat(dir, path, host, ""));
    if (identity != nullptr) return identity;
    if (gpu >= 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("another flatshard-worker drives GPU ", gpu, " (it holds ", path,
                       "); give this one another --gpu or --state-dir"));
    }
  }
  return absl::ResourceExhaustedError(absl::StrCat("--state-dir ", dir, ": all ", kMaxSlots,
                                                   " worker slots are held by live workers"));
}

absl::StatusOr<std::unique_ptr<WorkerIdentity>> WorkerIdentity::ClaimId(const std::string& dir,
                                                                        const std::string& id) {
  if (id.empty()) return absl::InvalidArgumentError("--worker-id must not be empty");
  // The seat file keeps the id on a line of its own, read back trimmed.
  if (absl::ascii_isspace(static_cast<unsigned char>(id.front())) ||
      absl::ascii_isspace(static_cast<unsigned char>(id.back())) ||
      std::any_of(id.begin(), id.end(),
                  [](char c) { return absl::ascii_iscntrl(static_cast<unsigned char>(c)); })) {
    return absl::InvalidArgumentError(
        absl::StrCat("--worker-id '", absl::CHexEscape(id),
                     "' must not begin or end with white space or hold control characters"));
  }
  RETURN_IF_ERROR(CreateStateDir(dir));
  const std::string path = absl::StrCat(dir, "/", IdSeatName(id));
  ASSIGN_OR_RETURN(std::unique_ptr<WorkerIdentity> identity, TakeSeat(dir, path, "", id));
  if (identity == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("another flatshard-worker runs as worker id '", id, "' (it holds ", path,
                     "); give this one another --worker-id or --state-dir"));
  }
  return identity;
}

absl::StatusOr<std::unique_ptr<WorkerIdentity>> WorkerIdentity::TakeSeat(const std::string& dir,
                                                                         const std::string& path,
                                                                         const std::string& host,
                                                                         const std::string& id) {
  // Not through a link, and not a file others can read or write: the
  // secret in it is the worker's proof of identity.
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, ": cannot open ", path, ": ", strerror(errno)));
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, ": cannot stat ", path, ": ", strerror(error)));
  }
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrFormat("--state-dir %s: %s is not a regular file only its owner can use (mode "
                        "%04o); it keeps an identity secret",
                        dir, path, st.st_mode & 07777));
  }
  // Another user's file: whoever owns it can read the secret, and could
  // have planted a secret of their choosing.
  if (st.st_uid != ::geteuid()) {
    ::close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, ": ", path, " belongs to uid ", st.st_uid,
                     ", not to this worker's uid ", ::geteuid(),
                     "; it keeps an identity secret (run the worker as that user, or keep "
                     "--state-dir on a local disk: an NFS export that squashes root gives "
                     "root's files to nobody)"));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    ::close(fd);
    if (error == EWOULDBLOCK) return nullptr;  // a live worker's seat
    // A file system without locks (Lustre without -o flock) cannot keep
    // two daemons off one seat: refused rather than trusted.
    return absl::FailedPreconditionError(
        absl::StrCat("--state-dir ", dir, ": cannot lock ", path, ": ", strerror(error)));
  }
  absl::StatusOr<Seat> seat = ReadSeat(fd, path);
  if (seat.ok() && !id.empty() && !seat->id.empty() && seat->id != id) {
    // Only a hash collision of two long ids, or an edited file.
    seat = absl::FailedPreconditionError(absl::StrCat(
        "--state-dir ", dir, ": ", path, " holds id '", seat->id, "', not '", id, "'"));
  }
  if (seat.ok() && (seat->id.empty() || seat->secret.empty())) {
    if (seat->id.empty()) seat->id = id.empty() ? FreshId(host) : id;
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

WorkerIdentity::~WorkerIdentity() { ::close(fd_); }

}  // namespace flatshard
