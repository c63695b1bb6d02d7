#include "worker/comm/file_store.h"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flatshard {
namespace {

// Polling is how a filesystem store learns about other processes' writes; the
// interval grows so an idle wait costs little.
constexpr absl::Duration kFirstPoll = absl::Microseconds(200);
constexpr absl::Duration kMaxPoll = absl::Milliseconds(20);

absl::Status ErrnoStatus(const std::string& what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

std::atomic<uint64_t> temp_counter{0};

}  // namespace

absl::Status PrefixStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  std::vector<std::string> prefixed;
  prefixed.reserve(keys.size());
  for (const std::string& key : keys) prefixed.push_back(Key(key));
  return inner_->Wait(prefixed, timeout);
}

absl::StatusOr<std::shared_ptr<FileStore>> FileStore::Open(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("file store: cannot create '", directory, "': ", error.message()));
  }
  return std::shared_ptr<FileStore>(new FileStore(directory));
}

std::string FileStore::PathOf(const std::string& key) const {
  // Keys carry '/' and other characters; keep a readable, injective file name.
  std::string name;
  for (char ch : key) {
    const auto c = static_cast<unsigned char>(ch);
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.') {
      name.push_back(static_cast<char>(c));
    } else {
      absl::StrAppend(&name, "%", absl::Hex(c, absl::kZeroPad2));
    }
  }
  return directory_ + "/" + name;
}

void FileStore::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.has_value()) aborted_ = reason;
}

absl::Status FileStore::AbortedStatus() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!aborted_.has_value()) return absl::OkStatus();
  return absl::AbortedError(absl::StrCat("rendezvous store aborted: ", *aborted_));
}

absl::Status FileStore::Set(const std::string& key, const std::string& value) {
  if (absl::Status aborted = AbortedStatus(); !aborted.ok()) return aborted;
  const std::string path = PathOf(key);
  const std::string temp = absl::StrCat(path, ".tmp.", getpid(), ".", temp_counter++);
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out.write(value.data(), static_cast<std::streamsize>(value.size()));
    if (!out) return ErrnoStatus(absl::StrCat("file store: write '", temp, "'"));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    return ErrnoStatus(absl::StrCat("file store: rename to '", path, "'"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> FileStore::Get(const std::string& key, absl::Duration timeout) {
  if (absl::Status s = Wait({key}, timeout); !s.ok()) return s;
  std::ifstream in(PathOf(key), std::ios::binary);
  if (!in) return ErrnoStatus(absl::StrCat("file store: read key '", key, "'"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

absl::Status FileStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  absl::Duration poll = kFirstPoll;
  while (true) {
    if (absl::Status aborted = AbortedStatus(); !aborted.ok()) return aborted;
    std::vector<std::string> missing;
    for (const std::string& key : keys) {
      if (!std::filesystem::exists(PathOf(key))) missing.push_back(key);
    }
    if (missing.empty()) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("store: timed out after ", absl::FormatDuration(timeout),
                       " waiting for key(s) ", absl::StrJoin(missing, ", ")));
    }
    std::this_thread::sleep_for(absl::ToChronoMicroseconds(std::min(poll, deadline - absl::Now())));
    poll = std::min(poll * 2, kMaxPoll);
  }
}

absl::StatusOr<int64_t> FileStore::Add(const std::string& key, int64_t delta) {
  if (absl::Status aborted = AbortedStatus(); !aborted.ok()) return aborted;
  const std::string lock_path = PathOf(key) + ".lock";
  const int fd = ::open(lock_path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoStatus(absl::StrCat("file store: open '", lock_path, "'"));
  if (::flock(fd, LOCK_EX) != 0) {
    ::close(fd);
    return ErrnoStatus("file store: flock");
  }
  int64_t value = 0;
  {
    std::ifstream in(PathOf(key));
    std::string text;
    if (in && std::getline(in, text) && !absl::SimpleAtoi(text, &value)) {
      ::close(fd);
      return absl::InternalError(
          absl::StrCat("file store: key '", key, "' holds '", text, "', not an integer"));
    }
  }
  value += delta;
  absl::Status status = Set(key, std::to_string(value));
  ::close(fd);  // releases the lock
  if (!status.ok()) return status;
  return value;
}

}  // namespace flatshard
