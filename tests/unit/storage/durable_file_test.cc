// Tests storage/durable_file.h's WriteFileDurably on real files: the file has
// its mode from its creation on, whatever someone left at its temporary
// name, and a private one (keys, tokens) is not written into a directory
// others may write to.
#include "storage/durable_file.h"

#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

mode_t ModeOf(const std::string& path) {
  struct stat info = {};
  EXPECT_EQ(::lstat(path.c_str(), &info), 0) << path;
  return info.st_mode & 07777;
}

std::string Contents(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

class DurableFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = absl::StrCat(::testing::TempDir(), "/durable-file-", ::getpid());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    fs::permissions(dir_, fs::perms::owner_all);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string dir_;
};

TEST_F(DurableFileTest, WritesTheContentsWithTheMode) {
  const std::string key = dir_ + "/key.pem";
  ASSERT_TRUE(WriteFileDurably(key, "secret\n", 0600).ok());
  EXPECT_EQ(Contents(key), "secret\n");
  EXPECT_EQ(ModeOf(key), 0600u);
  EXPECT_FALSE(fs::exists(key + ".tmp"));
  // Replaced whole, the mode kept.
  ASSERT_TRUE(WriteFileDurably(key, "another\n", 0600).ok());
  EXPECT_EQ(Contents(key), "another\n");
  EXPECT_EQ(ModeOf(key), 0600u);
}

// A file left at the temporary name with a mode of its own would have kept
// that mode (O_CREAT opens an existing file as it is), and the key would be
// renamed into place readable by everyone.
TEST_F(DurableFileTest, AFileLeftAtTheTemporaryNameDoesNotLendItsMode) {
  const std::string key = dir_ + "/admin.token";
  { std::ofstream(key + ".tmp") << "planted"; }
  fs::permissions(key + ".tmp", fs::perms::all);
  ASSERT_EQ(ModeOf(key + ".tmp"), 0777u);
  ASSERT_TRUE(WriteFileDurably(key, "token\n", 0600).ok());
  EXPECT_EQ(Contents(key), "token\n");
  EXPECT_EQ(ModeOf(key), 0600u);
}

// A link at the temporary name would have sent the secret into its target.
TEST_F(DurableFileTest, ALinkAtTheTemporaryNameIsNotFollowed) {
  const std::string target = dir_ + "/elsewhere";
  { std::ofstream(target) << "untouched"; }
  const std::string key = dir_ + "/join.token";
  fs::create_symlink(target, key + ".tmp");
  ASSERT_TRUE(WriteFileDurably(key, "token\n", 0600).ok());
  EXPECT_EQ(Contents(target), "untouched");
  EXPECT_EQ(Contents(key), "token\n");
  EXPECT_FALSE(fs::is_symlink(key));
}

TEST_F(DurableFileTest, APrivateFileIsNotWrittenWhereOthersMayReplaceIt) {
  fs::permissions(dir_, fs::perms::all);  // 0777, not sticky
  const std::string key = dir_ + "/worker-key.pem";
  const absl::Status refused = WriteFileDurably(key, "secret\n", 0600);
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(std::string(refused.message()), HasSubstr(dir_));
  EXPECT_THAT(std::string(refused.message()), HasSubstr("writable by every user (mode 0777)"));
  EXPECT_FALSE(fs::exists(key));
  EXPECT_FALSE(fs::exists(key + ".tmp"));
  // A public file (a certificate) may go there.
  EXPECT_TRUE(WriteFileDurably(dir_ + "/worker.pem", "cert\n", 0644).ok());
  // Writable by its group only (umask 002, a group of one's own): written.
  fs::permissions(dir_, fs::perms::owner_all | fs::perms::group_all | fs::perms::others_read |
                            fs::perms::others_exec);
  EXPECT_TRUE(WriteFileDurably(key, "secret\n", 0600).ok());
  EXPECT_EQ(ModeOf(key), 0600u);
  fs::remove(key);
  // A sticky directory (/tmp's kind) lets no one replace another's file.
  fs::permissions(dir_, fs::perms::all);
  fs::permissions(dir_, fs::perms::sticky_bit, fs::perm_options::add);
  EXPECT_TRUE(WriteFileDurably(key, "secret\n", 0600).ok());
  EXPECT_EQ(ModeOf(key), 0600u);
}

}  // namespace
}  // namespace flatshard
