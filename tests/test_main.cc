// The main() of every gtest program here. Each run makes a directory of its
// own under $TMPDIR (or /tmp) and runs with TMPDIR pointing at it, so that
// ::testing::TempDir(), std::filesystem::temp_directory_path() and
// testing::MakeTempDir all land in it: the fixed names tests use there
// cannot collide with another test running at the same time (ctest -j), and
// a run that passes leaves nothing behind. A run that fails keeps it (it
// holds what the test wrote, the daemons' logs among it) and says where.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <system_error>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace {

// Set in the environment of everything a run starts: a death test's
// re-executed child, or a daemon, uses its parent's directory as it is.
constexpr char kOwnerVariable[] = "FLATSHARD_TEST_TMPDIR";

}  // namespace

int main(int argc, char** argv) {
  ::testing::InitGoogleMock(&argc, argv);
  std::string own;
  if (std::getenv(kOwnerVariable) == nullptr) {
    const char* base = std::getenv("TMPDIR");
    const std::string pattern =
        std::string(base != nullptr && *base != '\0' ? base : "/tmp") + "/flatshard-test-XXXXXX";
    std::vector<char> buffer(pattern.begin(), pattern.end());
    buffer.push_back('\0');
    if (mkdtemp(buffer.data()) == nullptr) {
      std::cerr << "mkdtemp(" << pattern << "): " << std::strerror(errno) << "\n";
      return 1;
    }
    own = buffer.data();
    setenv("TMPDIR", own.c_str(), /*overwrite=*/1);
    setenv(kOwnerVariable, own.c_str(), /*overwrite=*/1);
  }
  const int result = RUN_ALL_TESTS();
  if (!own.empty()) {
    if (result == 0) {
      std::error_code ignored;
      std::filesystem::remove_all(own, ignored);
    } else {
      std::cerr << "this run's files are kept in " << own << "\n";
    }
  }
  return result;
}
