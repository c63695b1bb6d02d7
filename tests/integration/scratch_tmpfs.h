// A real full disk for a test: a small tmpfs mounted on one of the test's
// directories, unmounted (lazily: a daemon may still hold a file there) when
// destroyed. Mounting needs CAP_SYS_ADMIN (root in CI); elsewhere Mount says
// why it could not, for the test's GTEST_SKIP.
#ifndef FLATSHARD_TESTS_INTEGRATION_SCRATCH_TMPFS_H_
#define FLATSHARD_TESTS_INTEGRATION_SCRATCH_TMPFS_H_

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>

#include <sys/mount.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace flatshard::testing {

class ScratchTmpfs {
 public:
  // At `path` (made if missing), `size` as mount(8)'s size= ("64k", "64m").
  static absl::StatusOr<std::unique_ptr<ScratchTmpfs>> Mount(const std::string& path,
                                                             const std::string& size) {
    std::error_code ignored;
    std::filesystem::create_directories(path, ignored);
    const std::string options = "size=" + size;
    if (::mount("flatshard-test", path.c_str(), "tmpfs", 0, options.c_str()) != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot mount a tmpfs at ", path, ": ", std::strerror(errno), " (needs CAP_SYS_ADMIN)"));
    }
    return std::unique_ptr<ScratchTmpfs>(new ScratchTmpfs(path));
  }
  ~ScratchTmpfs() { ::umount2(path_.c_str(), MNT_DETACH); }
  ScratchTmpfs(const ScratchTmpfs&) = delete;
  ScratchTmpfs& operator=(const ScratchTmpfs&) = delete;

 private:
  explicit ScratchTmpfs(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_SCRATCH_TMPFS_H_
