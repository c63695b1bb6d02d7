// The job lifecycle of docs/architecture.md §4: which transitions are allowed, that a
// refused one changes nothing, and that watchers see every event in order.
#include "coordinator/job_state_machine.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(JobStateMachineTest, TheHappyPathAndItsEvents) {
  JobStateMachine m("j");
  EXPECT_EQ(m.state(), v1::PENDING);
  ASSERT_TRUE(m.Transition(v1::FORMING, "configuring").ok());
  ASSERT_TRUE(m.Transition(v1::READY, "formed").ok());
  ASSERT_TRUE(m.Transition(v1::TRAINING, "train 5").ok());
  ASSERT_TRUE(m.Transition(v1::IDLE, "done").ok());
  ASSERT_TRUE(m.Transition(v1::TRAINING, "again").ok());
  ASSERT_TRUE(m.Transition(v1::FAILED, "rank 2 died").ok());
  EXPECT_EQ(m.failure(), "rank 2 died");
  ASSERT_TRUE(m.Transition(v1::STOPPED, "deleted").ok());
  const auto events = m.EventsFrom(0, absl::Now());
  ASSERT_EQ(events.size(), 8u);
  const v1::JobState want[] = {v1::PENDING, v1::FORMING,  v1::READY,  v1::TRAINING,
                               v1::IDLE,    v1::TRAINING, v1::FAILED, v1::STOPPED};
  for (size_t i = 0; i < events.size(); ++i) EXPECT_EQ(events[i].state, want[i]) << i;
  EXPECT_EQ(events[6].message, "rank 2 died");
}

// The observer (the job persisting itself) records a transition before it is
// visible: a client that saw a state finds it in the store after a crash of
// the coordinator right after (PeerSnapshotRecoveryTest's restart saw the
// recovery's READY, then restarted from the FORMING before it).
TEST(JobStateMachineTest, ATransitionIsRecordedBeforeItIsVisible) {
  JobStateMachine m("j");
  std::vector<std::string> seen;
  m.set_on_transition([&] {
    const JobStateMachine::Recorded r = m.ForRecord();
    seen.push_back(absl::StrCat(v1::JobState_Name(r.state), " '", r.failure, "' recorded while ",
                                v1::JobState_Name(m.state()), " shows, ",
                                m.EventsFrom(0, absl::Now()).size(), " events"));
  });
  ASSERT_TRUE(m.Transition(v1::FORMING, "configuring").ok());
  ASSERT_TRUE(m.Transition(v1::FAILED, "rank 1 could not be configured").ok());
  EXPECT_THAT(seen,
              ElementsAre("FORMING '' recorded while PENDING shows, 1 events",
                          "FAILED 'rank 1 could not be configured' recorded while FORMING shows, 2 "
                          "events"));
  EXPECT_EQ(m.ForRecord().state, v1::FAILED);
  EXPECT_EQ(m.ForRecord().failure, "rank 1 could not be configured");
  // A refused transition records nothing.
  EXPECT_FALSE(m.Transition(v1::TRAINING, "x").ok());
  EXPECT_EQ(seen.size(), 2u);
}

// A watcher woken by a transition finds it recorded: the record is written
// before the event is published, however long the write takes.
TEST(JobStateMachineTest, AWatcherWakesOnlyOnceTheTransitionIsRecorded) {
  JobStateMachine m("j");
  std::atomic<bool> recorded{false};
  absl::Notification woke;
  m.set_on_transition([&] {
    // A slow write: what a watcher woken meanwhile would see.
    (void)woke.WaitForNotificationWithTimeout(absl::Milliseconds(300));
    recorded = true;
  });
  bool recorded_when_woken = false;
  std::thread watcher([&] {
    const std::vector<JobEventRecord> events = m.EventsFrom(1, absl::Now() + absl::Seconds(30));
    recorded_when_woken = recorded;
    woke.Notify();
    EXPECT_EQ(events.size(), 1u);
  });
  ASSERT_TRUE(m.Transition(v1::FORMING, "configuring").ok());
  watcher.join();
  EXPECT_TRUE(recorded_when_woken);
}

TEST(JobStateMachineTest, IllegalTransitionsAreRefusedAndChangeNothing) {
  struct Case {
    v1::JobState from, to;
  };
  for (const Case& c :
       {Case{v1::PENDING, v1::TRAINING}, Case{v1::PENDING, v1::READY},
        Case{v1::FORMING, v1::TRAINING}, Case{v1::READY, v1::IDLE}, Case{v1::TRAINING, v1::READY},
        Case{v1::FAILED, v1::TRAINING}, Case{v1::STOPPED, v1::FORMING},
        Case{v1::STOPPED, v1::STOPPED}, Case{v1::FAILED, v1::FAILED},
        Case{v1::PENDING, v1::RECOVERING}, Case{v1::FAILED, v1::RECOVERING},
        Case{v1::RECOVERING, v1::TRAINING}, Case{v1::RECOVERING, v1::IDLE}}) {
    EXPECT_FALSE(JobStateMachine::Allowed(c.from, c.to))
        << v1::JobState_Name(c.from) << " -> " << v1::JobState_Name(c.to);
  }
  JobStateMachine m("j");
  const absl::Status refused = m.Transition(v1::TRAINING, "too early");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.message()), HasSubstr("job 'j' is PENDING"));
  EXPECT_EQ(m.state(), v1::PENDING);
  EXPECT_EQ(m.EventsFrom(0, absl::Now()).size(), 1u);
  // A failed job can be re-formed.
  ASSERT_TRUE(m.Transition(v1::FAILED, "x").ok());
  EXPECT_TRUE(JobStateMachine::Allowed(v1::FAILED, v1::FORMING));
  // A recovery's re-formation that another failure interrupts recovers again.
  EXPECT_TRUE(JobStateMachine::Allowed(v1::FORMING, v1::RECOVERING));
}

TEST(JobStateMachineTest, RecoveryGoesThroughFormingBackToReady) {
  JobStateMachine m("j");
  for (v1::JobState s : {v1::FORMING, v1::READY, v1::TRAINING, v1::RECOVERING, v1::FORMING,
                         v1::READY, v1::TRAINING, v1::IDLE, v1::RECOVERING}) {
    ASSERT_TRUE(m.Transition(s, "").ok()) << v1::JobState_Name(s);
  }
  // A recovery that cannot re-form ends the job.
  ASSERT_TRUE(m.Transition(v1::FAILED, "no spare").ok());
  EXPECT_EQ(m.failure(), "no spare");
}

TEST(JobStateMachineTest, ARestoredJobIsReadoptedOrRolledBack) {
  JobStateMachine m("j");
  m.Restore(v1::RECOVERING, "", "the coordinator restarted");
  EXPECT_EQ(m.state(), v1::RECOVERING);
  const auto events = m.EventsFrom(0, absl::Now());
  ASSERT_EQ(events.size(), 1u);  // the history starts at the restore
  EXPECT_EQ(events[0].message, "the coordinator restarted");
  // Re-adopted as it is, or rolled back (a recovery from a checkpoint).
  EXPECT_TRUE(JobStateMachine::Allowed(v1::RECOVERING, v1::READY));
  EXPECT_TRUE(JobStateMachine::Allowed(v1::RECOVERING, v1::RECOVERING));
  int observed = 0;
  m.set_on_transition([&] { ++observed; });
  ASSERT_TRUE(m.Transition(v1::READY, "re-adopted").ok());
  EXPECT_FALSE(m.Transition(v1::FORMING, "refused").ok());
  EXPECT_EQ(observed, 1);  // told of transitions made, not of refused ones
  m.Restore(v1::FAILED, "rank 1 died", "restored FAILED");
  EXPECT_EQ(m.failure(), "rank 1 died");
}

TEST(JobStateMachineTest, TransitionFromRacesHaveOneWinner) {
  JobStateMachine m("j");
  ASSERT_TRUE(m.Transition(v1::FORMING, "").ok());
  ASSERT_TRUE(m.Transition(v1::READY, "").ok());
  int won = 0;
  std::vector<std::thread> threads;
  threads.reserve(8);
  std::mutex mu;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      if (m.TransitionFrom(v1::READY, v1::TRAINING, "train").ok()) {
        std::lock_guard<std::mutex> lock(mu);
        ++won;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(won, 1);
}

TEST(JobStateMachineTest, WatchersWakeOnEventsAndOnClose) {
  JobStateMachine m("j");
  std::vector<JobEventRecord> seen;
  std::thread watcher([&] {
    size_t next = 1;
    while (true) {
      auto events = m.EventsFrom(next, absl::InfiniteFuture());
      if (events.empty()) break;  // closed
      next += events.size();
      seen.insert(seen.end(), events.begin(), events.end());
    }
  });
  ASSERT_TRUE(m.Transition(v1::FORMING, "a").ok());
  ASSERT_TRUE(m.Transition(v1::STOPPED, "b").ok());
  m.Close();
  watcher.join();
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen.back().state, v1::STOPPED);
  EXPECT_TRUE(m.closed());
  EXPECT_TRUE(m.end().ok()) << m.end();
}

TEST(JobStateMachineTest, EventsAfterAShutdownsCloseAreKeptButNotWatched) {
  JobStateMachine m("j");
  ASSERT_TRUE(m.Transition(v1::FORMING, "a").ok());
  m.Close(absl::UnavailableError("shutting down"));
  // The shutdown then stops the job in memory: its state, not its history.
  ASSERT_TRUE(m.Transition(v1::STOPPED, "SIGTERM").ok());
  m.Close();  // Stop's own close: the first one's end stays
  EXPECT_EQ(m.state(), v1::STOPPED);
  const std::vector<JobEventRecord> seen = m.EventsFrom(0, absl::InfiniteFuture());
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen.back().state, v1::FORMING);
  EXPECT_TRUE(m.EventsFrom(2, absl::InfiniteFuture()).empty());
  EXPECT_EQ(m.end().code(), absl::StatusCode::kUnavailable) << m.end();
}

}  // namespace
}  // namespace flatshard
