// Runs one rank of a W-process FSDP job on one machine without a coordinator:
// rendezvous through a Store (a FileStore in a shared directory), the step
// program compiled locally, data from a deterministic DataSource. This is the
// data plane's harness (tests, benchmarks, `flatshard-train-local`); the
// coordinator drives the same FsdpRuntime through the same programs.
#ifndef FLATSHARD_WORKER_RUNTIME_LOCAL_TRAINER_H_
#define FLATSHARD_WORKER_RUNTIME_LOCAL_TRAINER_H_

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/model_spec.h"
#include "core/wrap_policy.h"
#include "worker/comm/store.h"
#include "worker/compute/data_source.h"
#include "worker/runtime/fsdp_runtime.h"

namespace flatshard {

struct LocalTrainOptions {
  ModelSpec spec;
  WrapPolicy policy;
  RuntimeOptions runtime;
  compute::DataSourceOptions data;
  int64_t steps = 1;
  // no_sync micro-steps before each synced step; each uses its own global batch
  // (data step = step * (micro_steps + 1) + k).
  int no_sync_micro_steps = 0;
  bool summon_final_params = true;
};

struct LocalStepRecord {
  int64_t step = 0;
  double loss = 0.0;  // this rank's mean loss over its batches of the step
  StepStats stats;
};

struct LocalTrainResult {
  std::vector<LocalStepRecord> steps;
  std::map<std::string, std::vector<float>> final_params;  // when summoned
  int64_t peak_unsharded_bytes = 0;
  int peak_live_units = 0;
  bool same_host_collectives = false;  // FsdpRuntime::same_host_collectives
};

// `on_step` (optional) sees each step as it completes.
absl::StatusOr<LocalTrainResult> TrainLocalRank(
    const LocalTrainOptions& options, int rank, int world_size, const std::shared_ptr<Store>& store,
    const std::function<void(const LocalStepRecord&)>& on_step = nullptr);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_LOCAL_TRAINER_H_
