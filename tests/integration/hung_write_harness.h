// What the hung-write tests share (checkpoint_faults_test.cc,
// stalled_save_test.cc): a cluster whose one worker's checkpoint write hangs
// for good, and the check that the wedged worker ended itself and the job
// recovered onto the spare.
#ifndef FLATSHARD_TESTS_INTEGRATION_HUNG_WRITE_HARNESS_H_
#define FLATSHARD_TESTS_INTEGRATION_HUNG_WRITE_HARNESS_H_

#include <optional>
#include <string>

#include <gtest/gtest.h>
#include <sys/wait.h>

#include "absl/strings/str_cat.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "core/worker_exit_codes.h"
#include "tests/integration/checkpoint_harness.h"

namespace flatshard::checkpoint_testing {

// A cluster of `workers` daemons checkpointing into `root` whose worker
// `wedged` hangs for good (ignoring aborts) once 4 KiB of its file `file` of
// checkpoint "stuck" are written: fast heartbeats, a 5 s collective timeout,
// an 8 s abort grace, and `batch_timeout_s`.
inline LocalClusterOptions HangCluster(const std::string& root, int workers, int wedged,
                                       const std::string& file, int batch_timeout_s) {
  LocalClusterOptions options;
  options.workers = workers;
  options.bin_dir = BinDir();
  options.checkpoint_dir = root;
  options.heartbeat_interval_s = 0.25;
  options.heartbeat_timeout_s = 2.0;
  options.collective_timeout_s = 5;
  options.worker_flags = {
      {wedged, {"--inject-file-faults", absl::StrCat("hang:stuck.partial/", file, ":4096")}}};
  options.every_worker_flags = {"--abort-grace", "8"};
  options.coordinator_flags = {"--batch-timeout", absl::StrCat(batch_timeout_s),
                               "--configure-timeout", "30"};
  return options;
}

// The wedged worker `wedged` ends itself with status 3, and the job is READY
// again at world size 2 after exactly one restart (a try that chose the
// wedged worker would have spent a second).
inline void ExpectWedgedExitAndOneRecovery(LocalCluster& cluster, FlatshardClient& client,
                                           int wedged) {
  const std::optional<int> exit = cluster.worker(wedged).Wait(absl::Seconds(60));
  ASSERT_TRUE(exit.has_value()) << "the wedged worker is still running";
  ASSERT_TRUE(WIFEXITED(*exit)) << "wait status " << *exit;
  EXPECT_EQ(WEXITSTATUS(*exit), kWedgedExitCode);
  absl::StatusOr<v1::JobState> ready =
      client.WaitForState(kJob, {v1::READY}, absl::Seconds(60), {v1::RECOVERING});
  ASSERT_TRUE(ready.ok()) << ready.status();
  absl::StatusOr<v1::Job> job = client.GetJob(kJob);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->world_size(), 2);
  EXPECT_EQ(job->restarts(), 1) << "a recovery try chose the wedged worker";
}

}  // namespace flatshard::checkpoint_testing

#endif  // FLATSHARD_TESTS_INTEGRATION_HUNG_WRITE_HARNESS_H_
