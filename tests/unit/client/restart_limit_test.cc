#include "client/restart_limit.h"

#include <gtest/gtest.h>

#include "absl/time/time.h"

namespace flatshard {
namespace {

TEST(RestartLimitTest, AllowsABurstWithinTheWindowThenRefusesUntilTheOldestAgesOut) {
  RestartLimit limit(3, absl::Minutes(10));
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  EXPECT_TRUE(limit.Allow(t0));
  EXPECT_TRUE(limit.Allow(t0 + absl::Minutes(1)));
  EXPECT_TRUE(limit.Allow(t0 + absl::Minutes(2)));
  EXPECT_EQ(limit.count(), 3);
  // A fourth within 10 minutes of the first is refused, and not counted.
  EXPECT_FALSE(limit.Allow(t0 + absl::Minutes(9)));
  EXPECT_EQ(limit.count(), 3);
  // Once the first is older than the window, one more is allowed.
  EXPECT_TRUE(limit.Allow(t0 + absl::Minutes(10) + absl::Seconds(1)));
  EXPECT_EQ(limit.count(), 3);
  EXPECT_FALSE(limit.Allow(t0 + absl::Minutes(11)));
  // A long quiet spell forgets them all.
  EXPECT_TRUE(limit.Allow(t0 + absl::Hours(1)));
  EXPECT_EQ(limit.count(), 1);
}

TEST(RestartLimitTest, WouldAllowSaysWhatAllowWouldWithoutCounting) {
  RestartLimit limit(2, absl::Minutes(10));
  const absl::Time t0 = absl::UnixEpoch() + absl::Hours(1);
  EXPECT_TRUE(limit.WouldAllow(t0));
  EXPECT_TRUE(limit.Allow(t0));
  EXPECT_TRUE(limit.WouldAllow(t0 + absl::Seconds(1)));
  EXPECT_EQ(limit.count(), 1);
  EXPECT_TRUE(limit.Allow(t0 + absl::Minutes(1)));
  EXPECT_FALSE(limit.WouldAllow(t0 + absl::Minutes(2)));
  // Later, once the first has aged out, it would again; as Allow then does.
  EXPECT_TRUE(limit.WouldAllow(t0 + absl::Minutes(10) + absl::Seconds(1)));
  EXPECT_EQ(limit.count(), 2);
  EXPECT_TRUE(limit.Allow(t0 + absl::Minutes(10) + absl::Seconds(1)));
}

TEST(RestartLimitTest, ABurstOfZeroNeverRestarts) {
  RestartLimit limit(0, absl::Minutes(10));
  EXPECT_FALSE(limit.WouldAllow(absl::UnixEpoch()));
  EXPECT_FALSE(limit.Allow(absl::UnixEpoch()));
  EXPECT_EQ(limit.count(), 0);
}

}  // namespace
}  // namespace flatshard
