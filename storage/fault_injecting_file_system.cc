#include "storage/fault_injecting_file_system.h"

#include <algorithm>
#include <csignal>
#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

#include "core/status_macros.h"

namespace flatshard {
namespace {

class FaultyFile : public WritableFile {
 public:
  FaultyFile(std::unique_ptr<WritableFile> base, std::string path, std::vector<FileFault> faults)
      : base_(std::move(base)), path_(std::move(path)), faults_(std::move(faults)) {}

  absl::Status Append(absl::string_view data) override {
    for (const FileFault& f : faults_) {
      if (f.kind == FileFault::Kind::kCrash && written_ + data.size() > f.after_bytes) {
        std::raise(SIGKILL);  // a crash mid-write, at a chosen byte
      }
      if (f.kind == FileFault::Kind::kHang && written_ + data.size() > f.after_bytes) {
        // A write into a hung mount: it never returns, and nothing the
        // process does (an abort, a shutdown) gets it back.
        absl::Notification never;
        never.WaitForNotification();
      }
      if (f.kind == FileFault::Kind::kSlow) {
        // A disk that still takes writes, slowly (a congested network
        // mount): each write moves the file on, so a stall watcher must not
        // take it for a hung one.
        absl::SleepFor(f.delay);
      }
      if (f.kind == FileFault::Kind::kDiskFull && written_ + data.size() > f.after_bytes) {
        // What a full disk does: the bytes that fit, then ENOSPC.
        const uint64_t fit = f.after_bytes > written_ ? f.after_bytes - written_ : 0;
        RETURN_IF_ERROR(base_->Append(data.substr(0, fit)));
        written_ += fit;
        return absl::UnavailableError(
            absl::StrCat("cannot write ", path_, ": ", std::strerror(ENOSPC)));
      }
    }
    RETURN_IF_ERROR(base_->Append(data));
    written_ += data.size();
    return absl::OkStatus();
  }
  absl::Status Sync() override {
    for (const FileFault& f : faults_) {
      if (f.kind == FileFault::Kind::kSyncError) {
        return absl::UnavailableError(
            absl::StrCat("cannot fsync ", path_, ": ", std::strerror(EIO)));
      }
    }
    return base_->Sync();
  }
  absl::Status Close() override { return base_->Close(); }
  absl::Status Seek(uint64_t offset) override { return base_->Seek(offset); }

 private:
  std::unique_ptr<WritableFile> base_;
  std::string path_;
  std::vector<FileFault> faults_;
  uint64_t written_ = 0;
};

}  // namespace

absl::StatusOr<std::vector<FileFault>> ParseFileFaults(const std::string& spec) {
  std::vector<FileFault> out;
  for (absl::string_view part : absl::StrSplit(spec, ',', absl::SkipEmpty())) {
    const std::vector<std::string> fields = absl::StrSplit(part, ':');
    FileFault fault;
    const auto bad = [&](const std::string& why) {
      return absl::InvalidArgumentError(
          absl::StrCat("file fault '", part, "': ", why,
                       " (expected disk-full:SUBSTRING[:BYTES], sync-error:SUBSTRING, "
                       "crash:SUBSTRING[:BYTES], hang:SUBSTRING[:BYTES] or slow:SUBSTRING:MS)"));
    };
    if (fields.size() < 2 || fields.size() > 3 || fields[1].empty()) {
      return bad("wrong number of fields");
    }
    if (fields[0] == "disk-full") {
      fault.kind = FileFault::Kind::kDiskFull;
    } else if (fields[0] == "sync-error") {
      fault.kind = FileFault::Kind::kSyncError;
    } else if (fields[0] == "crash") {
      fault.kind = FileFault::Kind::kCrash;
    } else if (fields[0] == "hang") {
      fault.kind = FileFault::Kind::kHang;
    } else if (fields[0] == "slow") {
      fault.kind = FileFault::Kind::kSlow;
    } else {
      return bad(absl::StrCat("unknown kind '", fields[0], "'"));
    }
    fault.path_contains = fields[1];
    if (fault.kind == FileFault::Kind::kSlow) {
      uint64_t ms = 0;
      if (fields.size() != 3) return bad("slow needs MS, how much longer each write takes");
      if (!absl::SimpleAtoi(fields[2], &ms)) {
        return bad(absl::StrCat("MS '", fields[2], "' is not a number"));
      }
      fault.delay = absl::Milliseconds(ms);
      out.push_back(std::move(fault));
      continue;
    }
    if (fields.size() == 3 && !absl::SimpleAtoi(fields[2], &fault.after_bytes)) {
      return bad(absl::StrCat("BYTES '", fields[2], "' is not a number"));
    }
    if (fields.size() == 3 && fault.kind == FileFault::Kind::kSyncError) {
      return bad("sync-error takes no BYTES");
    }
    out.push_back(std::move(fault));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectingFileSystem::NewWritableFile(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->NewWritableFile(path));
  return Wrap(std::move(file), path);
}

absl::StatusOr<std::unique_ptr<WritableFile>> FaultInjectingFileSystem::OpenSharedFile(
    const std::string& path, uint64_t size) {
  ASSIGN_OR_RETURN(std::unique_ptr<WritableFile> file, base_->OpenSharedFile(path, size));
  return Wrap(std::move(file), path);
}

std::unique_ptr<WritableFile> FaultInjectingFileSystem::Wrap(std::unique_ptr<WritableFile> file,
                                                             const std::string& path) const {
  std::vector<FileFault> mine;
  std::copy_if(faults_.begin(), faults_.end(), std::back_inserter(mine),
               [&](const FileFault& f) { return path.find(f.path_contains) != std::string::npos; });
  if (mine.empty()) return file;
  return std::make_unique<FaultyFile>(std::move(file), path, std::move(mine));
}

}  // namespace flatshard
