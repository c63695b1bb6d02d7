// The cluster most control-plane tests start: a real coordinator and worker
// daemons (LocalCluster: child processes, gRPC on loopback), and the
// example MLP job (examples/mlp-job.yaml) at the cluster's size, READY.
// Header-only: each test target defines FLATSHARD_BIN_DIR (the daemons) and
// FLATSHARD_SOURCE_DIR.
#ifndef FLATSHARD_TESTS_INTEGRATION_MLP_CLUSTER_H_
#define FLATSHARD_TESTS_INTEGRATION_MLP_CLUSTER_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

#include "client/flatshard_client.h"
#include "client/local_cluster.h"
#include "storage/spec_files.h"
#include "tests/integration/multiprocess.h"

namespace flatshard::testing {

struct MlpCluster {
  std::unique_ptr<LocalCluster> cluster;
  std::unique_ptr<FlatshardClient> client;
  v1::JobSpec spec;  // as created
};

// `workers` daemons, checkpoints in a fresh temporary dir named after
// `tag`; `adjust` changes the cluster's options and the job before either
// starts.
inline absl::StatusOr<MlpCluster> StartMlpCluster(
    const std::string& tag, int workers,
    const std::function<void(LocalClusterOptions&, v1::JobSpec&)>& adjust = {}) {
  const std::string dir = MakeTempDir(tag);
  LocalClusterOptions options;
  options.workers = workers;
  options.bin_dir = FLATSHARD_BIN_DIR;
  options.checkpoint_dir = dir + "/checkpoints";
  absl::StatusOr<v1::JobSpec> spec =
      LoadJobSpecFile(std::string(FLATSHARD_SOURCE_DIR) + "/examples/mlp-job.yaml");
  if (!spec.ok()) return spec.status();
  spec->set_world_size(workers);
  if (adjust) adjust(options, *spec);
  absl::StatusOr<std::unique_ptr<LocalCluster>> cluster = LocalCluster::Start(options);
  if (!cluster.ok()) return cluster.status();
  MlpCluster started{*std::move(cluster), nullptr, *std::move(spec)};
  started.client = std::make_unique<FlatshardClient>(started.cluster->address());
  if (absl::StatusOr<v1::Job> created = started.client->CreateJob(started.spec); !created.ok()) {
    return created.status();
  }
  absl::StatusOr<v1::JobState> ready =
      started.client->WaitForState(started.spec.name(), {v1::READY}, absl::Seconds(120));
  if (!ready.ok()) return ready.status();
  return started;
}

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_MLP_CLUSTER_H_
