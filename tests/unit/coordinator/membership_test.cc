// Tests coordinator/membership.h: stable rank assignment with its errors,
// heartbeats and staleness, and who may take over a worker's seat.
#include "coordinator/membership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/training_job.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// A registration with no identity secret or command token.
Registration Reg(const char* id, const char* host, const char* device, const char* address,
                 int rank, const char* metrics, const char* device_name, const char* secret = "") {
  Registration r;
  r.worker_id = id;
  r.host = host;
  r.device = device;
  r.address = address;
  r.requested_rank = rank;
  r.metrics_address = metrics;
  r.device_name = device_name;
  r.identity_secret = secret;
  return r;
}

TEST(MembershipTableTest, AssignsStableRanksAndRefusesConflicts) {
  MembershipTable table(3);
  const absl::Time now = absl::FromUnixSeconds(1000);
  EXPECT_EQ(table.Register(Reg("w-a", "h", "cpu", "h:1", -1, "", "cpu"), now)->rank, 0);
  EXPECT_EQ(table.Register(Reg("w-b", "h", "cpu", "h:2", 2, "", "cpu"), now)->rank, 2);
  EXPECT_EQ(table.Register(Reg("w-c", "h", "cpu", "h:3", -1, "", "cpu"), now)->rank, 1);
  // A restarted daemon keeps its rank.
  EXPECT_EQ(table.Register(Reg("w-a", "h", "cpu", "h:9", -1, "h:9400", "cpu"), now)->rank, 0);
  EXPECT_EQ(table.Register(Reg("w-d", "h", "cpu", "h:4", -1, "", "cpu"), now).status().code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(
      std::string(
          table.Register(Reg("w-e", "h", "cpu", "h:5", 2, "", "cpu"), now).status().message()),
      HasSubstr("rank 2 already belongs to worker 'w-b'"));
  EXPECT_EQ(table.Register(Reg("w-a", "h", "cpu", "h:1", 1, "", "cpu"), now).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(
      std::string(
          table.Register(Reg("w-f", "h", "cpu", "h:6", 3, "", "cpu"), now).status().message()),
      HasSubstr("requested_rank 3 is outside [0, 3)"));
  EXPECT_THAT(
      std::string(
          table.Register(Reg("", "h", "cpu", "h:6", -1, "", "cpu"), now).status().message()),
      HasSubstr("worker_id must not be empty"));
  EXPECT_THAT(
      std::string(
          table.Register(Reg("w-g", "h", "cpu", "", -1, "", "cpu"), now).status().message()),
      HasSubstr("address must not be empty"));
  EXPECT_THAT(
      std::string(
          table.Register(Reg("w-h", "h", "tpu", "h:7", -1, "", ""), now).status().message()),
      HasSubstr("register.device of worker 'w-h': unknown device kind 'tpu'; expected cpu, cuda "
                "or sim"));
  ASSERT_EQ(table.List().size(), 3u);
  EXPECT_EQ(table.List()[1].worker_id, "w-c");
  // The re-registration's addresses replace the old ones.
  EXPECT_EQ(table.List()[0].address, "h:9");
  EXPECT_EQ(table.List()[0].metrics_address, "h:9400");
  EXPECT_EQ(table.List()[0].device, "cpu");
}

TEST(MembershipTableTest, AJobRunsOnOneKindOfDevice) {
  auto record = [&](const char* id, const char* device) {
    WorkerRecord r;
    r.worker_id = id;
    r.device = device;
    return r;
  };
  const WorkerRecord cpu_a = record("a", "cpu"), cpu_b = record("b", "cpu"),
                     gpu = record("g", "cuda");
  EXPECT_TRUE(CheckOneDeviceKind({cpu_a, cpu_b}).ok());
  const absl::Status mixed = CheckOneDeviceKind({cpu_a, gpu, cpu_b});
  EXPECT_EQ(mixed.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(mixed.message()),
              HasSubstr("the job's workers mix device kinds (cpu: a, b; cuda: g)"));
}

TEST(MembershipTableTest, HeartbeatsAndStaleness) {
  MembershipTable table(0);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto a = table.Register(Reg("w-a", "h", "cpu", "h:1", -1, "", "cpu"), t0);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(table.Register(Reg("w-b", "h", "cpu", "h:2", -1, "", "cpu"), t0).ok());
  ASSERT_TRUE(table.Heartbeat("w-a", a->session, 7, "training", t0 + absl::Seconds(9)).ok());
  EXPECT_EQ(table.Heartbeat("w-z", a->session, 1, "", t0).code(), absl::StatusCode::kNotFound);
  // Bound to the registration: another session, or none, is not w-a's.
  EXPECT_EQ(table.Heartbeat("w-a", "", 1, "", t0).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(table.Heartbeat("w-a", std::string(64, '0'), 1, "", t0).code(),
            absl::StatusCode::kNotFound);
  const auto stale = table.Stale(t0 + absl::Seconds(10), absl::Seconds(5));
  ASSERT_EQ(stale.size(), 1u);
  EXPECT_EQ(stale[0].worker_id, "w-b");
  EXPECT_EQ(table.List()[0].last_completed_seq, 7u);
}

TEST(MembershipTableTest, UnreachableIsStaleUntilTheNextHeartbeat) {
  MembershipTable table(0);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto a = table.Register(Reg("w-a", "h", "cpu", "h:1", -1, "", "cpu"), t0);
  ASSERT_TRUE(a.ok());
  table.MarkUnreachable("w-a", "h:9");  // another registration's address: ignored
  EXPECT_TRUE(table.Stale(t0, absl::Seconds(5)).empty());
  table.MarkUnreachable("w-a", "h:1");
  table.MarkUnreachable("w-unknown", "h:1");  // ignored
  auto stale = table.Stale(t0, absl::Seconds(5));
  ASSERT_EQ(stale.size(), 1u);
  EXPECT_EQ(stale[0].state, "unreachable");
  ASSERT_TRUE(table.Heartbeat("w-a", a->session, 0, "idle", t0 + absl::Seconds(1)).ok());
  EXPECT_TRUE(table.Stale(t0 + absl::Seconds(1), absl::Seconds(5)).empty());
}

TEST(MembershipTableTest, ALiveWorkersIdIsTakenOverOnlyWithItsIdentity) {
  MembershipTable table(0, /*live_for=*/absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto first = table.Register(Reg("w-a", "h", "cpu", "h:1", -1, "", "cpu", "secret-1"), t0);
  ASSERT_TRUE(first.ok());
  // Someone who read the id registers it with another address: refused while
  // w-a heartbeats, and w-a's seat, address and session are unchanged.
  const absl::Status stolen =
      table.Register(Reg("w-a", "evil", "cpu", "evil:1", -1, "", "cpu", "guess"), t0).status();
  EXPECT_EQ(stolen.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(stolen.message()), HasSubstr("belongs to a live worker at h:1"));
  EXPECT_EQ(table.List()[0].address, "h:1");
  EXPECT_TRUE(table.HasSession(first->session));
  // The same daemon (same secret) re-registers at once; its old session ends.
  auto again = table.Register(Reg("w-a", "h", "cpu", "h:2", -1, "", "cpu", "secret-1"), t0);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->rank, first->rank);
  EXPECT_NE(again->session, first->session);
  EXPECT_FALSE(table.HasSession(first->session));
  EXPECT_TRUE(table.HasSession(again->session));
  // Once it has been silent past live_for, its seat may be claimed anew.
  EXPECT_TRUE(
      table.Register(Reg("w-a", "h2", "cpu", "h2:1", -1, "", "cpu", "new"), t0 + absl::Seconds(6))
          .ok());
  EXPECT_EQ(table.List()[0].address, "h2:1");
}

TEST(MembershipTableTest, ARestoredWorkerMustRegisterAgainButKeepsItsIdentity) {
  MembershipTable table(0);
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  auto first = table.Register(Reg("w-a", "h", "cpu", "h:1", -1, "", "cpu", "secret-1"), t0);
  ASSERT_TRUE(first.ok());
  std::vector<WorkerRecord> durable = table.List();
  MembershipTable restarted(0);
  restarted.Restore(durable, t0);
  // Sessions die with the coordinator: the old one is refused with NOT_FOUND,
  // which makes the worker register again.
  EXPECT_EQ(restarted.Heartbeat("w-a", first->session, 0, "", t0).code(),
            absl::StatusCode::kNotFound);
  EXPECT_FALSE(restarted.HasSession(first->session));
  EXPECT_TRUE(
      restarted.Register(Reg("w-a", "h", "cpu", "h:1", -1, "", "cpu", "secret-1"), t0).ok());
}

// Until the restored seat's own daemon registers again, for the liveness
// window after the restart, another identity cannot take its id (and rank).
TEST(MembershipTableTest, ARestoredSeatIsKeptForItsOwnDaemonUntilTheWindowEnds) {
  MembershipTable table(0, absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  ASSERT_TRUE(table.Register(Reg("w-a", "h", "cpu", "h:1", -1, "", "cpu", "secret-1"), t0).ok());
  ASSERT_TRUE(table.Register(Reg("w-b", "h", "cpu", "h:2", -1, "", "cpu", "secret-2"), t0).ok());
  const std::vector<WorkerRecord> durable = table.List();
  MembershipTable restarted(0, absl::Seconds(5));
  const absl::Time restart = t0 + absl::Minutes(10);  // long after the last heartbeats
  restarted.Restore(durable, restart);
  const auto impostor =
      restarted.Register(Reg("w-a", "x", "cpu", "x:1", -1, "", "cpu", "other"), restart);
  EXPECT_EQ(impostor.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(std::string(impostor.status().message()),
              HasSubstr("before the coordinator restarted"));
  // Its own daemon comes back under its rank.
  auto back = restarted.Register(Reg("w-a", "h", "cpu", "h:1", -1, "", "cpu", "secret-1"),
                                 restart + absl::Seconds(1));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->rank, 0);
  // A seat whose daemon never came back is released after the window.
  EXPECT_EQ(restarted
                .Register(Reg("w-b", "x", "cpu", "x:2", -1, "", "cpu", "other"),
                          restart + absl::Seconds(2))
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(restarted
                  .Register(Reg("w-b", "x", "cpu", "x:2", -1, "", "cpu", "other"),
                            restart + absl::Seconds(6))
                  .ok());
}

TEST(MembershipTableTest, ATakeoverByAnotherDaemonProcessIsReportedOnce) {
  MembershipTable table(0, /*live_for=*/absl::Seconds(5));
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  const auto as = [](Registration r, const char* incarnation) {
    r.incarnation = incarnation;
    return r;
  };
  ASSERT_TRUE(table.Register(as(Reg("w-a", "h", "cpu", "h:1", -1, "", "cpu", "s"), "p1"), t0).ok());
  // The same process registering again (its session was lost) is no takeover.
  ASSERT_TRUE(table.Register(as(Reg("w-a", "h", "cpu", "h:1", -1, "", "cpu", "s"), "p1"), t0).ok());
  EXPECT_TRUE(table.TakeReplaced().empty());
  // A restarted daemon with the id's secret, while the old one is live.
  ASSERT_TRUE(table.Register(as(Reg("w-a", "h", "cpu", "h:2", -1, "", "cpu", "s"), "p2"), t0).ok());
  const std::vector<MembershipTable::Replaced> replaced = table.TakeReplaced();
  ASSERT_EQ(replaced.size(), 1u);
  EXPECT_EQ(replaced[0].worker_id, "w-a");
  EXPECT_EQ(replaced[0].old_address, "h:1");
  EXPECT_EQ(replaced[0].new_address, "h:2");
  EXPECT_EQ(replaced[0].old_incarnation, "p1");
  EXPECT_TRUE(table.TakeReplaced().empty());
  // A worker that sends no incarnation (an older daemon) is never reported.
  ASSERT_TRUE(table.Register(Reg("w-a", "h", "cpu", "h:3", -1, "", "cpu", "s"), t0).ok());
  ASSERT_TRUE(table.Register(as(Reg("w-a", "h", "cpu", "h:4", -1, "", "cpu", "s"), "p3"), t0).ok());
  EXPECT_TRUE(table.TakeReplaced().empty());
}

}  // namespace
}  // namespace flatshard
