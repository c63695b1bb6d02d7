// A recovery's wait for a member whose aborted batch still runs: kept once
// it lets go, failed when it ended itself, refused as wedged past its grace,
// and never waited for when it drains nothing, has no grace, or the job stops.
#include "coordinator/drain_wait.h"

#include <algorithm>
#include <atomic>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

using ::testing::HasSubstr;

v1::GetStatusResponse Status(int64_t draining_ms, int64_t grace_ms) {
  v1::GetStatusResponse r;
  r.set_state("aborted");
  r.set_draining_ms(draining_ms);
  r.set_abort_grace_ms(grace_ms);
  return r;
}

// Answers from a script, in order; the last one again once it runs out.
class ScriptedProbe {
 public:
  explicit ScriptedProbe(std::vector<absl::StatusOr<v1::GetStatusResponse>> answers)
      : answers_(std::move(answers)) {}
  StatusProbe probe() {
    return [this]() -> absl::StatusOr<v1::GetStatusResponse> {
      const size_t i = std::min(calls_++, answers_.size() - 1);
      return answers_[i];
    };
  }
  size_t calls() const { return calls_; }

 private:
  std::vector<absl::StatusOr<v1::GetStatusResponse>> answers_;
  size_t calls_ = 0;
};

DrainWaitOptions Fast() {
  DrainWaitOptions o;
  o.poll = absl::Milliseconds(5);
  o.margin = absl::Milliseconds(50);
  return o;
}

TEST(DrainWaitTest, AMemberThatDrainsNothingOrHasNoGraceIsNotWaitedFor) {
  ScriptedProbe never({absl::InternalError("must not be probed")});
  auto idle = AwaitDrained(Status(0, 8000), never.probe(), {}, "rank 0", Fast());
  ASSERT_TRUE(idle.ok());
  auto no_grace = AwaitDrained(Status(300, 0), never.probe(), {}, "rank 0", Fast());
  ASSERT_TRUE(no_grace.ok());
  EXPECT_EQ(no_grace->draining_ms(), 300);
  auto failed = AwaitDrained(absl::UnavailableError("gone"), never.probe(), {}, "rank 0", Fast());
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(never.calls(), 0u);
}

TEST(DrainWaitTest, AMemberThatLetsGoIsKept) {
  ScriptedProbe probe({Status(20, 8000), Status(0, 8000)});
  auto answer = AwaitDrained(Status(10, 8000), probe.probe(), {}, "rank 1", Fast());
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->draining_ms(), 0);
  EXPECT_EQ(probe.calls(), 2u);
}

TEST(DrainWaitTest, AMemberThatEndedItselfFailsItsProbe) {
  ScriptedProbe probe({Status(20, 8000), absl::UnavailableError("Socket closed")});
  auto answer = AwaitDrained(Status(10, 8000), probe.probe(), {}, "rank 1", Fast());
  ASSERT_FALSE(answer.ok());
  EXPECT_THAT(answer.status().message(), HasSubstr("Socket closed"));
}

TEST(DrainWaitTest, AMemberStillDrainingPastItsGraceIsWedged) {
  ScriptedProbe probe({Status(100, 40)});
  auto answer = AwaitDrained(Status(30, 40), probe.probe(), {}, "job j: rank 1 (w1)", Fast());
  ASSERT_FALSE(answer.ok());
  EXPECT_EQ(answer.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(answer.status().message(), HasSubstr("job j: rank 1 (w1)"));
  EXPECT_THAT(answer.status().message(), HasSubstr("wedged"));
  EXPECT_GE(probe.calls(), 1u);
}

TEST(DrainWaitTest, AHugeReportedGraceIsCappedAndAStopEndsTheWait) {
  // A day's grace: without the cap this would wait a day.
  DrainWaitOptions capped = Fast();
  capped.cap = absl::Milliseconds(20);
  ScriptedProbe forever({Status(50, 86'400'000)});
  auto wedged = AwaitDrained(Status(10, 86'400'000), forever.probe(), {}, "rank 1", capped);
  EXPECT_THAT(wedged.status().message(), HasSubstr("wedged"));

  // The job stops: the last answer comes back as it is, after few polls.
  std::atomic<int> asked{0};
  ScriptedProbe draining({Status(50, 86'400'000)});
  auto stopped = AwaitDrained(
      Status(10, 86'400'000), draining.probe(), [&] { return ++asked > 3; }, "rank 1", Fast());
  ASSERT_TRUE(stopped.ok());
  EXPECT_GT(stopped->draining_ms(), 0);
  EXPECT_LE(draining.calls(), 3u);
}

}  // namespace
}  // namespace flatshard
