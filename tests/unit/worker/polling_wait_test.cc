// Tests worker/comm/polling_wait.h, the loop every wait on a non-blocking
// NCCL communicator runs (worker/comm/nccl_wait.h): on every machine, since
// the NCCL tests need a GPU. The outcome it returns, an abort and a deadline
// that end it, and that work found done is never reported as given up on.
#include "worker/comm/polling_wait.h"

#include <functional>
#include <optional>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/time/clock.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// Pending for `pending` polls, then `outcome`; counts the polls.
struct Work {
  int pending = 0;
  absl::Status outcome;
  int polls = 0;
  std::optional<absl::Status> operator()() {
    ++polls;
    if (polls <= pending) return std::nullopt;
    return outcome;
  }
};

TEST(PollingWaitTest, ReturnsTheWorksOutcomeOnceItHasOne) {
  Work work{3, absl::OkStatus()};
  PollingWait wait;
  wait.deadline = absl::Now() + absl::Seconds(60);
  wait.poll = absl::Milliseconds(1);
  EXPECT_TRUE(WaitUntil(std::ref(work), "ncclCommSplit", wait).ok());
  EXPECT_EQ(work.polls, 4);

  Work failed{2, absl::UnavailableError("remote process exited")};
  wait.yield_for = absl::Seconds(60);  // yielding, never sleeping
  EXPECT_EQ(WaitUntil(std::ref(failed), "ncclAllGather", wait),
            absl::UnavailableError("remote process exited"));
  EXPECT_EQ(failed.polls, 3);
}

TEST(PollingWaitTest, AnAbortEndsTheWaitNamingWhatAndWhy) {
  Work work{1000000, absl::OkStatus()};
  int asked = 0;
  PollingWait wait;
  wait.deadline = absl::Now() + absl::Seconds(60);
  wait.yield_for = absl::Seconds(60);
  wait.aborted = [&]() -> std::optional<std::string> {
    if (++asked < 5) return std::nullopt;
    return "re-configured for epoch 7";
  };
  const absl::Status status = WaitUntil(std::ref(work), "ncclCommInitRankConfig", wait);
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("ncclCommInitRankConfig aborted: re-configured for epoch 7"));
  EXPECT_EQ(work.polls, 5);  // asked before each check of the abort
}

TEST(PollingWaitTest, TheDeadlineEndsTheWaitSayingWhatItWaitedFor) {
  Work work{1000000, absl::OkStatus()};
  PollingWait wait;
  wait.deadline = absl::Now() + absl::Milliseconds(30);
  wait.poll = absl::Milliseconds(5);
  wait.waiting_for = "the group's other 1 ranks to join";
  const absl::Status status = WaitUntil(std::ref(work), "ncclCommInitRankConfig", wait);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded) << status;
  EXPECT_THAT(std::string(status.message()),
              HasSubstr("ncclCommInitRankConfig did not complete in time (waiting for the "
                        "group's other 1 ranks to join)"));
  EXPECT_GE(work.polls, 2);
}

// Work that ended is reported as ended, even past the deadline and with an
// abort asked for: the caller would otherwise abort a communicator whose
// work succeeded.
TEST(PollingWaitTest, WorkFoundDoneIsNeverReportedAsGivenUpOn) {
  Work work{0, absl::OkStatus()};
  PollingWait wait;
  wait.deadline = absl::InfinitePast();
  wait.aborted = [] { return std::optional<std::string>("shutting down"); };
  EXPECT_TRUE(WaitUntil(std::ref(work), "ncclReduceScatter", wait).ok());
  EXPECT_EQ(work.polls, 1);
}

}  // namespace
}  // namespace flatshard
