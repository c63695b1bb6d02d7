// The stall detector on real daemons and real files (docs/fault-tolerance.md,
// "Stalled ranks"): a checkpoint write that hangs for good is failed at
// --stall-timeout, not at the batch timeout, in a sync save's batch and in an
// async save's background write; and an async save's stuck rank is found
// while another rank's slow write still moves, because the commit watches
// every rank's write at once.
#include <filesystem>
#include <memory>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "storage/durable_file.h"
#include "tests/integration/checkpoint_harness.h"
#include "tests/integration/hung_write_harness.h"
#include "tests/integration/multiprocess.h"
#include "tests/integration/recovery_harness.h"

namespace flatshard {
namespace {

namespace fs = std::filesystem;
using checkpoint_testing::Dir;
using checkpoint_testing::ExpectTheJobTrainsAndSavesOn;
using checkpoint_testing::ExpectWedgedExitAndOneRecovery;
using checkpoint_testing::HangCluster;
using checkpoint_testing::kJob;
using checkpoint_testing::ReadTensors;
using checkpoint_testing::Save;
using checkpoint_testing::Spec;
using checkpoint_testing::Train;
using ::testing::HasSubstr;
using ::testing::Not;

// The same hung write, noticed by the stall detector rather than the batch
// timeout (10 minutes here); rank 1 hangs in its write, its progress
// counter still, and the coordinator fails it after --stall-timeout (5 s:
// it applies to every batch of the test, and a healthy fsync on a loaded
// disk must not trip it). The save fails naming the stall, and the job
// recovers onto the spare as above, within a minute. With the detector off
// the save would wait out the batch timeout.
//
// Sync: rank 0's part of the SHARDED save is written and answered, and the
// sequencer watches rank 1's batch. Async: the commit watches each rank's
// background write by its own counter (training moves the worker's main
// one) and fails rank 1 as a stalled batch's rank; the recovery's abort
// reaches the stuck write. Before, the async commit waited out the batch
// timeout, and the job trained on beside a worker that held the snapshot
// until the next save stopped on it.
class StalledRankTest : public ::testing::TestWithParam<bool> {};

TEST_P(StalledRankTest, AHungWriteIsFailedAtTheStallTimeoutNotTheBatchTimeout) {
  const bool async = GetParam();
  const std::string root = testing::MakeTempDir("ckpt-stall") + "/checkpoints";
  LocalClusterOptions options = HangCluster(root, 3, 1, "model-rank00001", 600);
  options.coordinator_flags.insert(options.coordinator_flags.end(), {"--stall-timeout", "5"});
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  FlatshardClient client((*cluster)->address());
  testing::CreateAndWaitReady(client, Spec(2, true));
  ASSERT_EQ(testing::WorkerIndexOfRank(**cluster, client, kJob, 1), 1);
  Train(client, 1);
  ASSERT_TRUE(Save(client, "before", v1::SHARDED_STATE_DICT, async).ok());

  const absl::Time start = absl::Now();
  absl::StatusOr<v1::CheckpointProgress> stuck =
      Save(client, "stuck", v1::SHARDED_STATE_DICT, async);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(stuck.ok());
  const std::string message(stuck.status().message());
  EXPECT_THAT(message, HasSubstr("made no progress for "));
  EXPECT_THAT(message, HasSubstr("--stall-timeout is 5s"));
  if (async) {
    EXPECT_THAT(message, HasSubstr("rank 1: its worker's ("));
    EXPECT_THAT(message, HasSubstr(") async write into 'mlp-demo/stuck.partial' made no progress"));
  } else {
    EXPECT_THAT(message, HasSubstr("rank 1: its worker ("));
    EXPECT_THAT(message, HasSubstr("while 1 of 2 ranks finished checkpoint batch"));
  }
  // A sync save returns once the recovery is done: the stall (5 s) and the
  // wedged worker's abort grace (8 s), far from the batch timeout; an
  // async one at the stall.
  EXPECT_LT(took, absl::Seconds(90));
  ASSERT_NO_FATAL_FAILURE(ExpectWedgedExitAndOneRecovery(**cluster, client, 1));
  EXPECT_EQ(testing::WorkerIndexOfRank(**cluster, client, kJob, 1), 2) << "not on the spare";
  EXPECT_FALSE(fs::exists(Dir(root, "stuck")));
  EXPECT_EQ(*ReadFileToString(absl::StrCat(root, "/", kJob, "/latest")), "before\n");
  ASSERT_NO_FATAL_FAILURE(
      ExpectTheJobTrainsAndSavesOn(client, root, v1::SHARDED_STATE_DICT, async));
  (*cluster)->Stop();  // the wedged daemon is gone: no clean stop to assert
}

INSTANTIATE_TEST_SUITE_P(SyncAndAsync, StalledRankTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& p) {
                           return p.param ? "Async" : "Sync";
                         });

// The stuck rank found while another still writes. Rank 0's async write of
// "stuck" is slow but moves (each write into its files takes 1 s longer, a
// congested mount: its progress counter first moves once its two files'
// headers are written, 2 s in, then every second, inside the 5 s stall
// timeout), and rank 1's hangs after 4 KiB. The commit watches both
// writes at once, so rank 1 is failed at the stall timeout, while rank 0's
// write cannot have ended yet: it makes at least one write per tensor of its
// files, each 1 s long (the bound below is counted from the same files of
// the save before). Awaited one after another, rank 1 would be watched only
// once rank 0's write had returned, and the save would fail after that bound.
// Rank 0 is not blamed: its write moved.
TEST(StalledAsyncWriteTest, AStuckRankIsFoundWhileASlowRankStillWrites) {
  const std::string root = testing::MakeTempDir("ckpt-slow-stall") + "/checkpoints";
  constexpr absl::Duration kWriteDelay = absl::Seconds(1);
  constexpr absl::Duration kStallTimeout = absl::Seconds(5);
  LocalClusterOptions options = HangCluster(root, 3, 1, "model-rank00001", 600);
  options.worker_flags[0] = {
      "--inject-file-faults",
      absl::StrCat("slow:stuck.partial/:", kWriteDelay / absl::Milliseconds(1))};
  options.coordinator_flags.insert(
      options.coordinator_flags.end(),
      {"--stall-timeout", absl::StrCat(kStallTimeout / absl::Seconds(1))});
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  ASSERT_TRUE(cluster.ok()) << cluster.status();
  FlatshardClient client((*cluster)->address());
  testing::CreateAndWaitReady(client, Spec(2, true));
  ASSERT_EQ(testing::WorkerIndexOfRank(**cluster, client, kJob, 0), 0);
  ASSERT_EQ(testing::WorkerIndexOfRank(**cluster, client, kJob, 1), 1);
  Train(client, 1);
  ASSERT_TRUE(Save(client, "before", v1::SHARDED_STATE_DICT, /*async_save=*/true).ok());

  // How long rank 0's write of the same state takes at the least.
  int64_t rank0_tensors = 0;
  for (const fs::directory_entry& file : fs::directory_iterator(Dir(root, "before"))) {
    const std::string name = file.path().filename().string();
    if (absl::StrContains(name, "rank00000") && absl::EndsWith(name, ".safetensors")) {
      rank0_tensors += static_cast<int64_t>(ReadTensors(file.path().string()).size());
    }
  }
  const absl::Duration slow_write = rank0_tensors * kWriteDelay;
  ASSERT_GE(slow_write, 3 * kStallTimeout) << rank0_tensors << " tensors: too few to tell";

  const absl::Time start = absl::Now();
  absl::StatusOr<v1::CheckpointProgress> stuck =
      Save(client, "stuck", v1::SHARDED_STATE_DICT, /*async_save=*/true);
  const absl::Duration took = absl::Now() - start;
  ASSERT_FALSE(stuck.ok());
  const std::string message(stuck.status().message());
  EXPECT_THAT(message, HasSubstr("rank 1: its worker's ("));
  EXPECT_THAT(message, HasSubstr(") async write into 'mlp-demo/stuck.partial' made no progress"));
  EXPECT_THAT(message, Not(HasSubstr("rank 0")));
  EXPECT_LT(took, slow_write) << "rank 1's write was watched only after rank 0's returned";
  ASSERT_NO_FATAL_FAILURE(ExpectWedgedExitAndOneRecovery(**cluster, client, 1));
  EXPECT_FALSE(fs::exists(Dir(root, "stuck")));
  EXPECT_EQ(*ReadFileToString(absl::StrCat(root, "/", kJob, "/latest")), "before\n");
  ASSERT_NO_FATAL_FAILURE(
      ExpectTheJobTrainsAndSavesOn(client, root, v1::SHARDED_STATE_DICT, /*async_save=*/true));
  (*cluster)->Stop();  // the wedged daemon is gone: no clean stop to assert
}

}  // namespace
}  // namespace flatshard
