// The worker's abort watchdog on its own: aborted work that does not return
// within the grace is reported once, with what it was; work that returned is
// not; a zero grace watches nothing. And WatchedBatch, which arms it for the
// batch in flight when an abort of its epoch arrives.
#include "worker/service/abort_watchdog.h"

#include <future>
#include <mutex>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// Collects the reports; the first also fulfils a future the test waits on
// (bounded), so no test sleeps to see whether the watchdog fired.
class Reports {
 public:
  std::function<void(const std::string&)> Sink() {
    return [this](const std::string& what) {
      std::lock_guard<std::mutex> lock(mu_);
      seen_.push_back(what);
      if (seen_.size() == 1) first_.set_value(what);
    };
  }
  // The first report, or "" if none came within 30 s.
  std::string First() {
    std::future<std::string> f = first_.get_future();
    return f.wait_for(std::chrono::seconds(30)) == std::future_status::ready ? f.get() : "";
  }
  size_t count() {
    std::lock_guard<std::mutex> lock(mu_);
    return seen_.size();
  }

 private:
  std::mutex mu_;
  std::vector<std::string> seen_;
  std::promise<std::string> first_;
};

TEST(AbortWatchdogTest, AbortedWorkThatDoesNotReturnIsReportedOnceNamingIt) {
  Reports reports;
  {
    AbortWatchdog watchdog(absl::Milliseconds(50), reports.Sink());
    EXPECT_NE(watchdog.Arm("batch seq 7 (checkpoint) of epoch 2"), 0u);
    const std::string first = reports.First();
    EXPECT_THAT(first, HasSubstr("batch seq 7 (checkpoint) of epoch 2"));
    EXPECT_THAT(first, HasSubstr("has not returned 50ms after it was aborted"));
    // Once wedged, a worker is not watched any further.
    watchdog.Arm("the next batch");
  }
  EXPECT_EQ(reports.count(), 1u);
}

TEST(AbortWatchdogTest, WorkThatReturnedInTimeIsNotReported) {
  Reports reports;
  // Long enough that Arm and Disarm are never that far apart, even on a
  // loaded machine.
  AbortWatchdog watchdog(absl::Seconds(2), reports.Sink());
  // Disarmed, the first would be due before the second: the second being
  // the one reported shows the first was forgotten.
  const uint64_t returned = watchdog.Arm("returned");
  watchdog.Disarm(returned);
  watchdog.Disarm(returned);  // twice, and a token of 0: ignored
  watchdog.Disarm(0);
  watchdog.Arm("stuck");
  EXPECT_THAT(reports.First(), HasSubstr("stuck"));
}

TEST(AbortWatchdogTest, TheWorkDueFirstIsReported) {
  Reports reports;
  AbortWatchdog watchdog(absl::Milliseconds(100), reports.Sink());
  watchdog.Arm("earlier");
  watchdog.Arm("later");
  EXPECT_THAT(reports.First(), HasSubstr("earlier"));
}

TEST(AbortWatchdogTest, AZeroGraceWatchesNothing) {
  Reports reports;
  {
    AbortWatchdog watchdog(absl::ZeroDuration(), reports.Sink());
    EXPECT_EQ(watchdog.Arm("anything"), 0u);
    watchdog.Disarm(0);
  }
  EXPECT_EQ(reports.count(), 0u);
}

TEST(WatchedBatchTest, AnAbortArmsTheBatchInFlightOnceAndItsEndDisarmsIt) {
  Reports reports;
  AbortWatchdog watchdog(absl::Seconds(2), reports.Sink());  // see above
  WatchedBatch batch(&watchdog);
  // No batch: an abort arms nothing and nothing drains.
  batch.Aborted("idle", 0);
  EXPECT_EQ(batch.Draining(), absl::ZeroDuration());

  batch.Begin("batch seq 4 (step) of epoch 3", 3);
  EXPECT_EQ(batch.Draining(), absl::ZeroDuration());  // running, not aborted
  batch.Aborted("an abort of epoch 2 is stale", 2);   // an older epoch's: ignored
  EXPECT_EQ(batch.Draining(), absl::ZeroDuration());
  batch.Aborted("rank 0 failed", 3);
  EXPECT_GE(batch.Draining(), absl::Milliseconds(1));
  batch.Aborted("a second abort", 0);  // does not restart the clock
  batch.End();                         // it let go in time
  EXPECT_EQ(batch.Draining(), absl::ZeroDuration());

  // The next batch does not let go: it alone is reported, naming the abort.
  batch.Begin("batch seq 5 (checkpoint) of epoch 3", 3);
  batch.Aborted("the coordinator went silent", 0);
  const std::string first = reports.First();
  EXPECT_THAT(first, HasSubstr("batch seq 5 (checkpoint) of epoch 3"));
  EXPECT_THAT(first, HasSubstr("(aborted: the coordinator went silent)"));
}

TEST(WatchedBatchTest, WithoutAWatchdogItStillSaysHowLongItDrains) {
  AbortWatchdog off(absl::ZeroDuration(), nullptr);
  WatchedBatch batch(&off);
  batch.Begin("batch seq 1 (step) of epoch 1", 1);
  batch.Aborted("rank 1 failed", 1);
  EXPECT_GE(batch.Draining(), absl::Milliseconds(1));
  batch.End();
  EXPECT_EQ(batch.Draining(), absl::ZeroDuration());
}

}  // namespace
}  // namespace flatshard
