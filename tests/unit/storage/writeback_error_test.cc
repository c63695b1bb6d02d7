// Tests storage/file_system.h's writers: a write error that the pacing wait
// reports is the file's error, returned at once and by Sync, since the
// kernel reports it to this descriptor once (errseq) and the fsync after it
// returns 0 (PostgreSQL's "fsyncgate").
//
// The files are real, on this machine's disk. Only the wait's answer is
// this test's: the binary defines sync_file_range(2) itself, which the
// storage library's calls bind to (the executable's definition comes before
// libc's), passing every call on to the kernel and, when a test asks, then
// failing the waits as a disk that lost the range's writeback would.
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

#include "storage/file_system.h"

namespace {

// errno for the calls that wait on a range's writeback (0: the kernel's answer).
std::atomic<int> fail_waits_with{0};
// errno for every call, waiting or not (0: the kernel's answer).
std::atomic<int> fail_all_with{0};
std::atomic<int> waits{0};

}  // namespace

extern "C" int sync_file_range(int fd, __off64_t offset, __off64_t count, unsigned int flags) {
  const int64_t done = ::syscall(SYS_sync_file_range, fd, offset, count, flags);
  if (done != 0) return static_cast<int>(done);
  const bool waits_after = (flags & SYNC_FILE_RANGE_WAIT_AFTER) != 0;
  if (waits_after) ++waits;
  const int err =
      fail_all_with.load() != 0 ? fail_all_with.load() : (waits_after ? fail_waits_with.load() : 0);
  if (err == 0) return 0;
  errno = err;
  return -1;
}

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// Enough for the writer to wait on its oldest range once (the in-flight
// bound plus two windows).
constexpr uint64_t kPastTheBound = kMaxWritebackInFlightBytes + 2 * kWritebackWindowBytes;

class WritebackErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/writeback-error-", ::getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override {
    fail_waits_with = 0;
    fail_all_with = 0;
    std::filesystem::remove_all(dir_);
  }
  // Appends `bytes` in 4 MiB pieces, as the checkpoint writers do; the
  // first error, or OK.
  static absl::Status AppendBytes(WritableFile& file, uint64_t bytes) {
    const std::string piece(uint64_t{4} << 20, 'x');
    for (uint64_t done = 0; done < bytes; done += piece.size()) {
      if (absl::Status s = file.Append(piece); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::string dir_;
};

TEST_F(WritebackErrorTest, AnErrorTheWaitReportsFailsTheAppendAndTheSync) {
  const std::string path = dir_ + "/shard.safetensors";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = FileSystem::Default()->NewWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  fail_waits_with = EIO;
  const int waits_before = waits.load();
  const absl::Status appended = AppendBytes(**file, kPastTheBound);
  ASSERT_GT(waits.load(), waits_before) << "the writer never waited on a range";
  EXPECT_EQ(appended.code(), absl::StatusCode::kUnavailable) << appended;
  EXPECT_THAT(std::string(appended.message()), HasSubstr(path));
  EXPECT_THAT(std::string(appended.message()), HasSubstr(std::strerror(EIO)));
  // The kernel's fsync would say OK now: the file's error stands.
  const absl::Status synced = (*file)->Sync();
  EXPECT_EQ(synced.code(), absl::StatusCode::kUnavailable) << synced;
  EXPECT_THAT(std::string(synced.message()), HasSubstr(std::strerror(EIO)));
}

// A shared file's writer moves between regions with Seek, which starts the
// writeback of what it wrote: the error reaches it there too.
TEST_F(WritebackErrorTest, AnErrorFailsASharedFilesSeekAndSync) {
  const std::string path = dir_ + "/model.safetensors";
  absl::StatusOr<std::unique_ptr<WritableFile>> file =
      FileSystem::Default()->OpenSharedFile(path, 2 * kPastTheBound);
  ASSERT_TRUE(file.ok()) << file.status();
  // Half a window past the bound: unstarted bytes for Seek to start.
  ASSERT_TRUE(AppendBytes(**file, kMaxWritebackInFlightBytes + kWritebackWindowBytes / 2).ok());
  fail_all_with = ENOSPC;
  const absl::Status moved = (*file)->Seek(kPastTheBound);
  EXPECT_EQ(moved.code(), absl::StatusCode::kUnavailable) << moved;
  EXPECT_THAT(std::string(moved.message()), HasSubstr(std::strerror(ENOSPC)));
  fail_all_with = 0;
  EXPECT_EQ((*file)->Sync().code(), absl::StatusCode::kUnavailable);
}

// A file system without sync_file_range is not paced, and that is no error:
// its writes are reported by fsync alone.
TEST_F(WritebackErrorTest, AFileSystemWithoutItIsNotAnError) {
  const std::string path = dir_ + "/local.safetensors";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = FileSystem::Default()->NewWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  fail_all_with = EINVAL;
  EXPECT_TRUE(AppendBytes(**file, kPastTheBound).ok());
  EXPECT_TRUE((*file)->Sync().ok());
  EXPECT_TRUE((*file)->Close().ok());
  EXPECT_EQ(std::filesystem::file_size(path), kPastTheBound);
}

// Without an error, the same writes go through whole (the test's own
// sync_file_range changes nothing on its own).
TEST_F(WritebackErrorTest, WithoutAnErrorTheFileIsWrittenWhole) {
  const std::string path = dir_ + "/ok.safetensors";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = FileSystem::Default()->NewWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const int waits_before = waits.load();
  ASSERT_TRUE(AppendBytes(**file, kPastTheBound).ok());
  EXPECT_GT(waits.load(), waits_before);
  EXPECT_TRUE((*file)->Sync().ok());
  EXPECT_TRUE((*file)->Close().ok());
  EXPECT_EQ(std::filesystem::file_size(path), kPastTheBound);
}

}  // namespace
}  // namespace flatshard
