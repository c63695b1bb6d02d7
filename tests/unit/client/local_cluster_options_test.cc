// LocalCluster's option checks and the GEMM thread share it gives each CPU
// worker (the workers themselves are exercised by the integration tests and
// tests/cli/worker_device_cli_test.sh, which checks the flag reaches OpenBLAS).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/local_cluster.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

TEST(ComputeThreadsPerWorkerTest, SplitsTheHostsThreadsEvenlyAndNeverBelowOne) {
  EXPECT_EQ(ComputeThreadsPerWorker(16, 1), 16);
  EXPECT_EQ(ComputeThreadsPerWorker(16, 4), 4);
  EXPECT_EQ(ComputeThreadsPerWorker(16, 5), 3);  // rounded down: never oversubscribed
  EXPECT_EQ(ComputeThreadsPerWorker(2, 2), 1);
  EXPECT_EQ(ComputeThreadsPerWorker(2, 4), 1);  // more workers than cores
  EXPECT_EQ(ComputeThreadsPerWorker(0, 2), 1);  // hardware_concurrency() unknown
  EXPECT_EQ(ComputeThreadsPerWorker(8, 0), 1);
}

TEST(LocalClusterOptionsTest, NegativeComputeThreadsAreRefusedBeforeAnythingStarts) {
  LocalClusterOptions options;
  options.compute_threads = -1;
  options.bin_dir = "/nonexistent";  // nothing may be spawned
  auto cluster = LocalCluster::Start(options);
  ASSERT_FALSE(cluster.ok());
  EXPECT_EQ(cluster.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(cluster.status().message(), HasSubstr("--compute-threads"));
  EXPECT_THAT(cluster.status().message(), HasSubstr("-1"));
}

}  // namespace
}  // namespace flatshard
