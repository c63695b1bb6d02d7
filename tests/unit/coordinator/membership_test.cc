// Tests coordinator/kv_store.h and coordinator/membership.h: the rendezvous
// store's semantics and limits, and stable rank assignment with its errors.
#include "coordinator/membership.h"

#include <limits>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/kv_store.h"
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

TEST(KvStoreTest, SetGetAddAndLimits) {
  KvStore store;
  EXPECT_EQ(store.Get("a").status().code(), absl::StatusCode::kNotFound);
  ASSERT_TRUE(store.Set("a", "1").ok());
  EXPECT_EQ(*store.Get("a"), "1");
  EXPECT_EQ(*store.Add("a", 4), 5);
  EXPECT_EQ(*store.Add("counter", -2), -2);
  ASSERT_TRUE(store.Set("text", "x").ok());
  EXPECT_THAT(std::string(store.Add("text", 1).status().message()),
              HasSubstr("does not hold an integer"));
  EXPECT_EQ(store.Set("", "v").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store.Set(std::string(KvStore::kMaxKeyBytes + 1, 'k'), "v").code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      std::string(store.Set("big", std::string(KvStore::kMaxValueBytes + 1, 'v')).message()),
      HasSubstr("more than the limit"));
  ASSERT_TRUE(store.Set("job/1/x", "1").ok());
  ASSERT_TRUE(store.Set("job/1/y", "1").ok());
  ASSERT_TRUE(store.Set("job/10/z", "1").ok());
  store.DeletePrefix("job/1");
  EXPECT_FALSE(store.Get("job/1/x").ok());
  EXPECT_TRUE(store.Get("job/10/z").ok());
}

TEST(KvStoreTest, WaitWakesOnSetAndTimesOutNamingTheKeys) {
  KvStore store;
  EXPECT_THAT(std::string(store.Wait({"p", "q"}, absl::Milliseconds(20)).message()),
              HasSubstr("waiting for key(s) p, q"));
  std::thread setter([&] {
    ASSERT_TRUE(store.Set("p", "1").ok());
    ASSERT_TRUE(store.Set("q", "2").ok());
  });
  EXPECT_TRUE(store.Wait({"p", "q"}, absl::Seconds(30)).ok());
  setter.join();
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
  table.MarkUnreachable("w-a");
  table.MarkUnreachable("w-unknown");  // ignored
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

TEST(KvStoreTest, KeysAndBytesPerJobAreLimited) {
  KvStore store(/*max_keys_per_job=*/3, /*max_bytes_per_job=*/64);
  ASSERT_TRUE(store.Set("job/a/epoch/1/k1", "v").ok());
  ASSERT_TRUE(store.Set("job/a/epoch/1/k2", "v").ok());
  ASSERT_TRUE(store.Set("job/a/epoch/1/k2", "w").ok());  // replacing is not a new key
  ASSERT_TRUE(store.Add("job/a/epoch/1/n", 1).ok());
  const absl::Status keys = store.Set("job/a/epoch/2/k", "v");
  EXPECT_EQ(keys.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(keys.message()), HasSubstr("keys_per_job (3) reached for 'job/a'"));
  EXPECT_TRUE(store.Set("job/b/k", "v").ok());  // another job has its own budget
  const absl::Status bytes = store.Set("job/b/k2", std::string(64, 'x'));
  EXPECT_EQ(bytes.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(bytes.message()), HasSubstr("bytes_per_job (64)"));
  EXPECT_FALSE(store.Get("job/b/k2").ok());  // nothing stored by the refused call
  store.DeletePrefix("job/a/epoch/1");       // an epoch ends: its budget returns
  EXPECT_TRUE(store.Set("job/a/epoch/2/k", "v").ok());
  EXPECT_EQ(store.Add("job/b/k3", std::numeric_limits<int64_t>::max()).value_or(0),
            std::numeric_limits<int64_t>::max());
  EXPECT_EQ(store.Add("job/b/k3", 1).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace flatshard
