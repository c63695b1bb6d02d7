// WorkerIdentity on real files and real flocks: live workers hold distinct
// seats, a seat freed by a dead worker gives the next daemon the same id, and
// a GPU's seat is that GPU's alone.
#include "worker/service/worker_identity.h"

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace flatshard {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

std::string FreshDir(const std::string& tag) {
  const fs::path dir = fs::path(::testing::TempDir()) / ("worker-identity-" + tag);
  fs::remove_all(dir);
  return dir.string();
}

TEST(WorkerIdentityTest, LiveWorkersHoldDistinctSeatsAndARestartGetsItsIdBack) {
  const std::string dir = FreshDir("slots");
  auto a = WorkerIdentity::Claim(dir, "node1", -1);
  auto b = WorkerIdentity::Claim(dir, "node1", -1);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_THAT((*a)->id(), StartsWith("node1-"));
  EXPECT_NE((*a)->id(), (*b)->id());
  EXPECT_EQ((*a)->seat_file(), dir + "/slot-0");
  EXPECT_EQ((*b)->seat_file(), dir + "/slot-1");
  const std::string first = (*a)->id();
  a->reset();  // the first worker dies; its lock goes with it
  auto restarted = WorkerIdentity::Claim(dir, "node1", -1);
  ASSERT_TRUE(restarted.ok());
  EXPECT_EQ((*restarted)->id(), first);
  EXPECT_EQ((*restarted)->seat_file(), dir + "/slot-0");
}

TEST(WorkerIdentityTest, AGpuSeatIsThatGpusAlone) {
  const std::string dir = FreshDir("gpu");
  auto gpu3 = WorkerIdentity::Claim(dir, "node2", 3);
  ASSERT_TRUE(gpu3.ok()) << gpu3.status();
  EXPECT_EQ((*gpu3)->seat_file(), dir + "/gpu-3");
  auto again = WorkerIdentity::Claim(dir, "node2", 3);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(again.status().message(), HasSubstr("another flatshard-worker drives GPU 3"));
  const std::string id = (*gpu3)->id();
  gpu3->reset();
  auto back = WorkerIdentity::Claim(dir, "node2", 3);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ((*back)->id(), id);
}

TEST(WorkerIdentityTest, AnUnusableDirectoryIsNamed) {
  const std::string file = FreshDir("file");
  { std::ofstream(file) << "not a directory"; }
  auto claimed = WorkerIdentity::Claim(file + "/ids", "h", -1);
  ASSERT_FALSE(claimed.ok());
  EXPECT_THAT(claimed.status().message(), HasSubstr("--state-dir " + file + "/ids"));
}

TEST(WorkerIdentityTest, AGivenIdKeepsItsSecretAcrossRestartsAndOneDaemonHoldsIt) {
  const std::string dir = FreshDir("given");
  auto first = WorkerIdentity::ClaimId(dir, "rank-3");
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ((*first)->id(), "rank-3");
  EXPECT_EQ((*first)->seat_file(), dir + "/id-rank-3");
  EXPECT_FALSE((*first)->secret().empty());
  EXPECT_EQ(fs::status((*first)->seat_file()).permissions() & fs::perms::all,
            fs::perms::owner_read | fs::perms::owner_write);
  auto twice = WorkerIdentity::ClaimId(dir, "rank-3");
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(twice.status().message(),
              HasSubstr("another flatshard-worker runs as worker id 'rank-3'"));
  // Another id is another seat, with its own secret.
  auto other = WorkerIdentity::ClaimId(dir, "rank-4");
  ASSERT_TRUE(other.ok()) << other.status();
  EXPECT_NE((*other)->secret(), (*first)->secret());
  const std::string secret = (*first)->secret();
  first->reset();  // the daemon dies
  auto restarted = WorkerIdentity::ClaimId(dir, "rank-3");
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  EXPECT_EQ((*restarted)->secret(), secret);
}

TEST(WorkerIdentityTest, AnyGivenIdMakesOneFileName) {
  const std::string dir = FreshDir("names");
  // Path separators, spaces and bytes outside ASCII are escaped.
  auto odd = WorkerIdentity::ClaimId(dir, "../pod 7/\xc3\xa9");
  ASSERT_TRUE(odd.ok()) << odd.status();
  EXPECT_EQ((*odd)->seat_file(), dir + "/id-..%2Fpod%207%2F%C3%A9");
  EXPECT_EQ((*odd)->id(), "../pod 7/\xc3\xa9");
  // An id too long for a file name is kept under its hash.
  const std::string long_id(250, 'x');
  auto hashed = WorkerIdentity::ClaimId(dir, long_id);
  ASSERT_TRUE(hashed.ok()) << hashed.status();
  EXPECT_THAT((*hashed)->seat_file(), StartsWith(dir + "/idsha256-"));
  EXPECT_EQ((*hashed)->id(), long_id);
  EXPECT_EQ(WorkerIdentity::ClaimId(dir, "").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(WorkerIdentityTest, ASeatOthersCouldReadOrALinkIsRefused) {
  const std::string dir = FreshDir("exposed");
  fs::create_directories(dir);
  { std::ofstream(dir + "/id-open") << "open\nsecret\n"; }
  fs::permissions(dir + "/id-open", fs::perms::owner_read | fs::perms::owner_write |
                                        fs::perms::group_read | fs::perms::others_read);
  auto exposed = WorkerIdentity::ClaimId(dir, "open");
  ASSERT_FALSE(exposed.ok());
  EXPECT_THAT(exposed.status().message(), HasSubstr("(mode 0644)"));
  fs::create_symlink(dir + "/id-open", dir + "/id-linked");
  auto linked = WorkerIdentity::ClaimId(dir, "linked");
  ASSERT_FALSE(linked.ok());
  EXPECT_THAT(linked.status().message(), HasSubstr("cannot open " + dir + "/id-linked"));
}

TEST(WorkerIdentityTest, ASeatHoldingAnotherIdIsRefused) {
  const std::string dir = FreshDir("mismatch");
  fs::create_directories(dir);
  { std::ofstream(dir + "/id-a") << "b\nsecret\n"; }
  fs::permissions(dir + "/id-a", fs::perms::owner_read | fs::perms::owner_write);
  auto claimed = WorkerIdentity::ClaimId(dir, "a");
  ASSERT_FALSE(claimed.ok());
  EXPECT_THAT(claimed.status().message(), HasSubstr("holds id 'b', not 'a'"));
}

// Another user's seat: they could read the secret, or have chosen it.
// Needs root to give the file away (CI runs as root); skipped elsewhere.
TEST(WorkerIdentityTest, ASeatOwnedByAnotherUserIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "giving a file to another uid needs root";
  const std::string dir = FreshDir("other-owner");
  fs::create_directories(dir);
  { std::ofstream(dir + "/id-theirs") << "theirs\nsecret\n"; }
  fs::permissions(dir + "/id-theirs", fs::perms::owner_read | fs::perms::owner_write);
  if (::chown((dir + "/id-theirs").c_str(), 12345, 12345) != 0) {
    // Root in a user namespace without that uid mapped.
    GTEST_SKIP() << "cannot give a file to uid 12345: " << std::strerror(errno);
  }
  auto claimed = WorkerIdentity::ClaimId(dir, "theirs");
  ASSERT_FALSE(claimed.ok());
  EXPECT_THAT(claimed.status().message(),
              HasSubstr("belongs to uid 12345, not to this worker's uid 0"));
  // Given back, it is the same worker's seat again.
  ASSERT_EQ(::chown((dir + "/id-theirs").c_str(), 0, 0), 0) << std::strerror(errno);
  auto mine = WorkerIdentity::ClaimId(dir, "theirs");
  ASSERT_TRUE(mine.ok()) << mine.status();
  EXPECT_EQ((*mine)->id(), "theirs");
}

}  // namespace
}  // namespace flatshard
