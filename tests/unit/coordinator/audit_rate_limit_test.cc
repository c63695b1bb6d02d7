// Tests coordinator/service/audit_rate_limit.h: a burst of refusals is
// written, then a steady rate, and the first line written after some were
// not says how many.
#include "coordinator/service/audit_rate_limit.h"

#include <optional>

#include <gtest/gtest.h>

namespace flatshard {
namespace {

TEST(AuditRateLimitTest, ABurstThenTheRateAndTheLinesNotWrittenCounted) {
  AuditRateLimit limit(/*lines_per_second=*/2, /*burst=*/3);
  const absl::Time start = absl::FromUnixSeconds(1000);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(limit.Admit(start), std::optional<int64_t>(0)) << i;
  for (int i = 0; i < 5; ++i) EXPECT_EQ(limit.Admit(start), std::nullopt) << i;
  // Half a second makes one line, which counts the five before it.
  EXPECT_EQ(limit.Admit(start + absl::Milliseconds(500)), std::optional<int64_t>(5));
  EXPECT_EQ(limit.Admit(start + absl::Milliseconds(500)), std::nullopt);
  EXPECT_EQ(limit.Admit(start + absl::Milliseconds(1000)), std::optional<int64_t>(1));
  // A long quiet refills the burst, no more.
  const absl::Time later = start + absl::Hours(1);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(limit.Admit(later), std::optional<int64_t>(0)) << i;
  EXPECT_EQ(limit.Admit(later), std::nullopt);
}

// A flood that stops is still counted: the next line of any kind takes the
// count, once.
TEST(AuditRateLimitTest, TheCountIsTakenByAnotherLineOnce) {
  AuditRateLimit limit(/*lines_per_second=*/1, /*burst=*/1);
  const absl::Time start = absl::FromUnixSeconds(1000);
  EXPECT_EQ(limit.Admit(start), std::optional<int64_t>(0));
  for (int i = 0; i < 4; ++i) EXPECT_EQ(limit.Admit(start), std::nullopt);
  EXPECT_EQ(limit.TakeNotWritten(), 4);
  EXPECT_EQ(limit.TakeNotWritten(), 0);
  EXPECT_EQ(limit.Admit(start + absl::Seconds(1)), std::optional<int64_t>(0));
}

// A clock that steps back (another thread's earlier reading) refills nothing.
TEST(AuditRateLimitTest, AnEarlierTimeRefillsNothing) {
  AuditRateLimit limit(/*lines_per_second=*/1, /*burst=*/1);
  const absl::Time start = absl::FromUnixSeconds(1000);
  EXPECT_EQ(limit.Admit(start), std::optional<int64_t>(0));
  EXPECT_EQ(limit.Admit(start - absl::Seconds(10)), std::nullopt);
  EXPECT_EQ(limit.Admit(start), std::nullopt);
  EXPECT_EQ(limit.Admit(start + absl::Seconds(1)), std::optional<int64_t>(2));
}

}  // namespace
}  // namespace flatshard
