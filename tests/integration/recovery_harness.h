// What the recovery tests share: a local cluster with fast heartbeats, a job
// created and READY, the worker process of a rank, and training that
// SIGKILLs ranks' workers after a given number of step results.
#ifndef FLATSHARD_TESTS_INTEGRATION_RECOVERY_HARNESS_H_
#define FLATSHARD_TESTS_INTEGRATION_RECOVERY_HARNESS_H_

#include <csignal>
#include <cstdint>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <gtest/gtest.h>

#include "client/flatshard_client.h"
#include "client/local_cluster.h"

namespace flatshard::testing {

inline std::unique_ptr<LocalCluster> StartRecoveryCluster(int workers,
                                                          const std::string& checkpoint_dir) {
  LocalClusterOptions options;
  options.workers = workers;
  options.bin_dir = FLATSHARD_BIN_DIR;
  options.heartbeat_interval_s = 0.25;
  options.heartbeat_timeout_s = 2.0;
  options.collective_timeout_s = 120;  // recovery must not wait for it
  options.checkpoint_dir = checkpoint_dir;
  auto cluster = LocalCluster::Start(options);
  EXPECT_TRUE(cluster.ok()) << cluster.status();
  return cluster.ok() ? *std::move(cluster) : nullptr;
}

inline void CreateAndWaitReady(FlatshardClient& client, const v1::JobSpec& spec) {
  ASSERT_TRUE(client.CreateJob(spec).ok());
  auto ready = client.WaitForState(spec.name(), {v1::READY}, absl::Seconds(120));
  ASSERT_TRUE(ready.ok()) << ready.status();
}

// The cluster's worker process that runs `rank` in the job now.
inline int WorkerIndexOfRank(LocalCluster& cluster, FlatshardClient& client, const std::string& job,
                             int rank) {
  auto workers = client.ListWorkers(job);
  EXPECT_TRUE(workers.ok()) << workers.status();
  for (const v1::WorkerInfo& w : *workers) {
    if (w.rank() != rank) continue;
    for (int i = 0; i < cluster.num_workers(); ++i) {
      if (cluster.worker_addresses()[static_cast<size_t>(i)] == w.address()) return i;
    }
  }
  ADD_FAILURE() << "no worker runs rank " << rank;
  return -1;
}

struct TrainRun {
  absl::Status status;
  std::map<int64_t, double> loss_by_step;  // the last loss seen for each step
  int recoveries_reported = 0;
};

// Trains `steps`; after `kill_after` step results, SIGKILLs the workers of `ranks`.
inline TrainRun TrainAndKill(LocalCluster& cluster, FlatshardClient& client, const std::string& job,
                             int64_t steps, int kill_after, const std::vector<int>& ranks) {
  std::vector<int> victims;
  victims.reserve(ranks.size());
  for (int rank : ranks) victims.push_back(WorkerIndexOfRank(cluster, client, job, rank));
  TrainRun run;
  int seen = 0;
  run.status = client.Train(job, steps, 0, [&](const v1::StepResult& r) {
    run.loss_by_step[r.step()] = r.loss();
    if (r.has_recovery()) {
      ++run.recoveries_reported;
      std::cerr << "recovered: " << r.recovery().ShortDebugString() << "\n";
    }
    if (++seen == kill_after) {
      for (int victim : victims) {
        if (victim >= 0) cluster.worker(victim).Signal(SIGKILL);
      }
    }
  });
  return run;
}

// Every step of `want` has the same loss in `got`, bit for bit.
inline void ExpectSameLosses(const std::map<int64_t, double>& got,
                             const std::map<int64_t, double>& want) {
  for (const auto& [step, loss] : want) {
    auto it = got.find(step);
    ASSERT_NE(it, got.end()) << "no loss for step " << step;
    EXPECT_EQ(it->second, loss) << "step " << step;  // bit for bit
  }
}

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_RECOVERY_HARNESS_H_
