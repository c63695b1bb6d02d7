// Tests the ranks that travel with a Status (core/status_payloads.h): kept
// through PrefixStatus, and whom a failed batch blames.
#include "core/status_payloads.h"

#include <optional>

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace flatshard {
namespace {

TEST(StatusPayloadsTest, RanksSurviveAPrefixAndOkCarriesNone) {
  const absl::Status failed =
      WithUnreachablePeer(WithFailedRank(absl::UnavailableError("reset"), 3), 9);
  const absl::Status prefixed = PrefixStatus("rank 3: ", failed);
  EXPECT_EQ(prefixed.message(), "rank 3: reset");
  EXPECT_EQ(FailedRank(prefixed), std::optional<int>(3));
  EXPECT_EQ(UnreachablePeer(prefixed), std::optional<int>(9));
  EXPECT_EQ(FailedRank(WithFailedRank(absl::OkStatus(), 3)), std::nullopt);
  EXPECT_EQ(FailedRank(WithFailedRank(absl::InternalError("x"), -1)), std::nullopt);
}

// A newcomer whose batch failed because its peer's connection closed under
// it is not passed over for it (coordinator: BlamedMember, RefuseJoiner).
TEST(StatusPayloadsTest, AFailedBatchBlamesItsRankUnlessItFailedOnALink) {
  const absl::Status own = WithFailedRank(absl::NotFoundError("no checkpoint"), 2);
  EXPECT_EQ(BlamedRank(own), std::optional<int>(2));
  EXPECT_EQ(BlamedRank(WithUnreachablePeer(own, 0)), std::nullopt);
  EXPECT_EQ(BlamedRank(absl::UnavailableError("no rank named")), std::nullopt);
}

}  // namespace
}  // namespace flatshard
