#include "worker/comm/abort_signal.h"

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace flatshard {
namespace {

TEST(AbortSignalTest, EveryHookRunsOnceWithTheFirstReason) {
  auto signal = std::make_shared<AbortSignal>();
  std::vector<std::string> seen;
  auto a = signal->OnAbort([&](const std::string& r) { seen.push_back("a:" + r); });
  auto b = signal->OnAbort([&](const std::string& r) { seen.push_back("b:" + r); });
  EXPECT_FALSE(signal->aborted());
  signal->Abort("first");
  signal->Abort("second");
  EXPECT_EQ(seen, (std::vector<std::string>{"a:first", "b:first"}));
  EXPECT_TRUE(signal->aborted());
  EXPECT_EQ(signal->reason(), "first");
}

TEST(AbortSignalTest, AHookRegisteredAfterTheAbortRunsAtOnce) {
  auto signal = std::make_shared<AbortSignal>();
  signal->Abort("gone");
  std::string seen;
  auto late = signal->OnAbort([&](const std::string& r) { seen = r; });
  EXPECT_EQ(seen, "gone");
}

TEST(AbortSignalTest, AnEndedRegistrationNeverRuns) {
  auto signal = std::make_shared<AbortSignal>();
  int runs = 0;
  auto kept = signal->OnAbort([&](const std::string&) { ++runs; });
  signal->OnAbort([&](const std::string&) { runs += 100; }).reset();
  signal->Abort("x");
  EXPECT_EQ(runs, 1);
}

// A hook may end another hook's registration (its owner torn down while the
// abort runs): that one is skipped, the rest still run.
TEST(AbortSignalTest, AHookMayEndAnotherRegistration) {
  auto signal = std::make_shared<AbortSignal>();
  std::vector<int> ran;
  std::unique_ptr<AbortSignal::Registration> second;
  auto first = signal->OnAbort([&](const std::string&) {
    ran.push_back(1);
    second.reset();
  });
  second = signal->OnAbort([&](const std::string&) { ran.push_back(2); });
  auto third = signal->OnAbort([&](const std::string&) { ran.push_back(3); });
  signal->Abort("x");
  EXPECT_EQ(ran, (std::vector<int>{1, 3}));
}

// The registration's owner frees what the hook touches right after ending
// it: ending a registration whose hook runs on another thread waits for it.
TEST(AbortSignalTest, EndingARegistrationWaitsForItsRunningHook) {
  auto signal = std::make_shared<AbortSignal>();
  absl::Notification entered, release;
  std::atomic<bool> hook_finished{false};
  auto registration = signal->OnAbort([&](const std::string&) {
    entered.Notify();
    release.WaitForNotification();
    hook_finished = true;
  });
  std::thread aborter([&] { signal->Abort("x"); });
  entered.WaitForNotification();
  absl::Notification ended;
  bool finished_when_ended = false;
  std::thread owner([&] {
    registration.reset();
    finished_when_ended = hook_finished;
    ended.Notify();
  });
  // Held by the running hook: not ended while it runs.
  EXPECT_FALSE(ended.WaitForNotificationWithTimeout(absl::Milliseconds(200)));
  release.Notify();
  owner.join();
  aborter.join();
  EXPECT_TRUE(finished_when_ended);
}

// Ending a registration whose hook has run returns at once, while the abort
// still runs a later hook (one that may wait for what the ender holds).
TEST(AbortSignalTest, EndingARegistrationDoesNotWaitForTheNextHook) {
  auto signal = std::make_shared<AbortSignal>();
  absl::Notification second_entered, release;
  auto first = signal->OnAbort([](const std::string&) {});
  auto second = signal->OnAbort([&](const std::string&) {
    second_entered.Notify();
    release.WaitForNotification();
  });
  std::thread aborter([&] { signal->Abort("x"); });
  second_entered.WaitForNotification();
  absl::Notification ended;
  std::thread owner([&] {
    first.reset();
    ended.Notify();
  });
  const bool ended_while_second_ran = ended.WaitForNotificationWithTimeout(absl::Seconds(10));
  release.Notify();
  owner.join();
  aborter.join();
  EXPECT_TRUE(ended_while_second_ran);
}

}  // namespace
}  // namespace flatshard
