// Tests coordinator/kv_store.h: the rendezvous store's semantics, its limits,
// and an abandoned prefix releasing the ranks that wait in it.
#include "coordinator/kv_store.h"

#include <atomic>
#include <limits>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

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

TEST(KvStoreTest, KeysAndBytesPerJobAreLimited) {
  KvStore store(KvStore::Limits{.keys_per_job = 3, .bytes_per_job = 64});
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

// Keys in namespaces a caller makes up ("a1", "a2", ...) each have a job's
// budget: the store's own bound holds over all of them.
TEST(KvStoreTest, KeysAndBytesOfTheWholeStoreAreLimited) {
  KvStore store(KvStore::Limits{.keys_total = 4, .bytes_total = 100});
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(store.Set(absl::StrCat("a", i), "v").ok()) << i;
  const absl::Status keys = store.Set("a4", "v");
  EXPECT_EQ(keys.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(keys.message()), HasSubstr("keys_total (4) reached"));
  EXPECT_EQ(store.Add("a5", 1).status().code(), absl::StatusCode::kResourceExhausted);
  ASSERT_TRUE(store.Set("a3", std::string(40, 'x')).ok());  // a replacement, within 100 bytes
  const absl::Status bytes = store.Set("a2", std::string(60, 'x'));
  EXPECT_EQ(bytes.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(bytes.message()), HasSubstr("bytes_total (100) reached"));
  EXPECT_EQ(store.Get("a2").value_or(""), "v");  // unchanged by the refused call
  EXPECT_EQ(store.size(), 4u);
  store.DeletePrefix("a3");  // only keys under "a3/": none
  EXPECT_EQ(store.size(), 4u);
  // A job's epoch ends: what it held returns to the whole store's budget.
  KvStore jobs(KvStore::Limits{.keys_total = 2});
  ASSERT_TRUE(jobs.Set("job/a/epoch/1/k1", "v").ok());
  ASSERT_TRUE(jobs.Set("job/b/epoch/1/k1", "v").ok());
  EXPECT_FALSE(jobs.Set("job/c/epoch/1/k1", "v").ok());
  jobs.DeletePrefix("job/a/epoch/1");
  EXPECT_TRUE(jobs.Set("job/c/epoch/1/k1", "v").ok());
}

TEST(KvStoreTest, AWaitWhoseCallerGaveUpReturnsWithinACheckAndIsCounted) {
  KvStore store;
  std::atomic<bool> gave_up{false};
  absl::Status waited;
  std::thread waiter([&] {
    waited = store.Wait({"job/a/epoch/1/rank1"}, absl::Hours(1), [&] { return gave_up.load(); });
  });
  const absl::Time started = absl::Now();
  while (store.waiting() == 0 && absl::Now() - started < absl::Seconds(30)) {
  }
  ASSERT_EQ(store.waiting(), 1u);
  const absl::Time given_up = absl::Now();
  gave_up = true;
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kCancelled) << waited;
  EXPECT_LT(absl::Now() - given_up, absl::Seconds(5));  // a check is 100 ms, not the hour
  EXPECT_EQ(store.waiting(), 0u);
  // A caller still there keeps waiting past many checks, and gets its keys.
  std::thread setter([&] {
    // Outlasts a few checks of the waiter below without a sleep: it waits
    // for a key nobody sets, and times out.
    EXPECT_EQ(store.Wait({"never"}, KvStore::kGaveUpCheck * 5).code(),
              absl::StatusCode::kDeadlineExceeded);
    EXPECT_TRUE(store.Set("job/a/epoch/1/rank1", "addr").ok());
  });
  EXPECT_TRUE(store.Wait({"job/a/epoch/1/rank1"}, absl::Seconds(30), [] { return false; }).ok());
  setter.join();
}

TEST(KvStoreTest, AnAbandonedPrefixReleasesItsWaitersAndRefusesItsKeys) {
  KvStore store;
  ASSERT_TRUE(store.Set("job/a/epoch/1/rank0", "addr").ok());
  // A rank in the epoch's rendezvous waits for a peer that will never come;
  // abandoning the epoch answers it long before its own timeout.
  absl::Status waited;
  std::thread waiter([&] { waited = store.Wait({"job/a/epoch/1/rank1"}, absl::Hours(1)); });
  // The waiter may or may not be blocked yet: both orders must end the same.
  store.Abandon("job/a/epoch/1", "rank 1 could not be configured: no data");
  waiter.join();
  EXPECT_EQ(waited.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(waited.message()),
              HasSubstr("the rendezvous under 'job/a/epoch/1' was abandoned: rank 1 could not be "
                        "configured: no data"));
  EXPECT_EQ(store.Set("job/a/epoch/1/rank1", "late").code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store.Get("job/a/epoch/1/rank0").status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(store.Add("job/a/epoch/1/n", 1).status().code(), absl::StatusCode::kAborted);
  // Only that prefix: the next epoch and a name that merely starts the same go on.
  EXPECT_TRUE(store.Set("job/a/epoch/2/rank0", "addr").ok());
  EXPECT_TRUE(store.Set("job/a/epoch/10/rank0", "addr").ok());
  EXPECT_TRUE(store.Wait({"job/a/epoch/10/rank0"}, absl::Seconds(1)).ok());
  // A wait on several keys fails when any of them is abandoned.
  EXPECT_EQ(store.Wait({"job/a/epoch/2/rank0", "job/a/epoch/1/rank0"}, absl::Seconds(1)).code(),
            absl::StatusCode::kAborted);
  // Deleting the epoch's keys (the next epoch formed) keeps the mark, so a
  // straggler cannot write there again; deleting another prefix keeps it too;
  // deleting the job (a new job of the same name starts at epoch 1 again)
  // forgets it.
  store.DeletePrefix("job/a/epoch/1");
  store.DeletePrefix("job/a/epoch/10");
  EXPECT_EQ(store.Set("job/a/epoch/1/x", "v").code(), absl::StatusCode::kAborted);
  store.DeletePrefix("job/a");
  EXPECT_TRUE(store.Set("job/a/epoch/1/rank0", "new").ok());
  EXPECT_EQ(*store.Get("job/a/epoch/1/rank0"), "new");
}

}  // namespace
}  // namespace flatshard
