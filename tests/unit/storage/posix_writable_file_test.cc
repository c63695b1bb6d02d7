// The real (POSIX) file writer against the real kernel: a file written much
// faster than the disk takes it never holds more than the writeback bound
// unwritten (storage/file_system.h), read back with cachestat(2).
#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/magic.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

#include "storage/file_system.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;

// cachestat(2), Linux 6.5: Debian 12's headers predate it, so its number and
// structs are spelled out (the same number in x86-64's and the generic table).
constexpr int kCachestatSyscall = 451;
struct CachestatRange {
  uint64_t off;
  uint64_t len;  // 0: to the end of the file
};
struct Cachestat {
  uint64_t nr_cache;
  uint64_t nr_dirty;
  uint64_t nr_writeback;
  uint64_t nr_evicted;
  uint64_t nr_recently_evicted;
};

TEST(PosixWritableFileTest, AFileNeverHoldsMoreThanTheBoundUnwritten) {
  const std::string dir = absl::StrCat(::testing::TempDir(), "/posix-writable-file");
  fs::remove_all(dir);
  fs::create_directories(dir);
  struct statfs where = {};
  ASSERT_EQ(::statfs(dir.c_str(), &where), 0);
  if (where.f_type == TMPFS_MAGIC) GTEST_SKIP() << dir << " is on tmpfs, which has no writeback";
  const std::string path = dir + "/big";
  absl::StatusOr<std::unique_ptr<WritableFile>> file = FileSystem::Default()->NewWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const int probe = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(probe, 0);
  const auto unwritten = [probe](uint64_t& bytes) {
    CachestatRange range = {0, 0};
    Cachestat stat = {};
    if (::syscall(kCachestatSyscall, probe, &range, &stat, 0) != 0) return errno;
    bytes = (stat.nr_dirty + stat.nr_writeback) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    return 0;
  };
  uint64_t bytes = 0;
  if (const int err = unwritten(bytes); err != 0) {
    ::close(probe);
    fs::remove_all(dir);
    // No such call (before Linux 6.5), a seccomp profile that predates it,
    // or a file system it does not cover.
    if (err == ENOSYS || err == EPERM || err == EOPNOTSUPP) {
      GTEST_SKIP() << "cachestat(2) is not available here: " << std::strerror(err);
    }
    FAIL() << "cachestat: " << std::strerror(err);
  }

  // 384 MiB in 4 MiB appends (a save's chunks), at memcpy's pace, then one
  // append of 96 MiB (a converter's whole tensor).
  const std::string chunk(size_t{4} << 20, 'x');
  uint64_t worst = 0;
  for (int i = 0; i < 96; ++i) {
    ASSERT_TRUE((*file)->Append(chunk).ok());
    ASSERT_EQ(unwritten(bytes), 0);
    worst = std::max(worst, bytes);
  }
  ASSERT_TRUE((*file)->Append(std::string(size_t{96} << 20, 'y')).ok());
  ASSERT_EQ(unwritten(bytes), 0);
  worst = std::max(worst, bytes);
  if (worst == 0) {
    // Right after an append its pages are dirty, unless the file's page
    // cache is not the one cachestat reads (overlayfs's upper file, FUSE).
    ::close(probe);
    fs::remove_all(dir);
    GTEST_SKIP() << "cachestat saw no dirty pages in " << dir
                 << ": this file system's page cache is not the file's own";
  }
  ASSERT_TRUE((*file)->Sync().ok());
  ASSERT_TRUE((*file)->Close().ok());
  ASSERT_EQ(unwritten(bytes), 0);
  const uint64_t after_sync = bytes;
  ::close(probe);
  EXPECT_EQ(fs::file_size(path), uint64_t{96} * chunk.size() + (uint64_t{96} << 20));
  fs::remove_all(dir);

  // What is in writeback, what was written since it was last started, and
  // the append that just landed.
  EXPECT_LE(worst, kMaxWritebackInFlightBytes + kWritebackWindowBytes + chunk.size());
  EXPECT_EQ(after_sync, 0u);
}

}  // namespace
}  // namespace flatshard
