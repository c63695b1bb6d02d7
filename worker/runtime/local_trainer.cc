#include "worker/runtime/local_trainer.h"

#include "core/status_macros.h"

namespace flatshard {

absl::StatusOr<LocalTrainResult> TrainLocalRank(
    const LocalTrainOptions& options, int rank, int world_size, const std::shared_ptr<Store>& store,
    const std::function<void(const LocalStepRecord&)>& on_step) {
  RuntimeOptions runtime_options = options.runtime;
  ASSIGN_OR_RETURN(std::unique_ptr<compute::DataSource> data,
                   compute::MakeDataSource(options.data));
  runtime_options.loss = data->loss();
  ASSIGN_OR_RETURN(
      std::unique_ptr<FsdpRuntime> runtime,
      FsdpRuntime::Create(options.spec, options.policy, runtime_options, rank, world_size, store));
  const StepProgram micro = runtime->CompileProgram(/*sync_gradients=*/false);
  const StepProgram synced = runtime->CompileProgram(/*sync_gradients=*/true);
  LocalTrainResult result;
  const int64_t per_step = options.no_sync_micro_steps + 1;
  for (int64_t step = 0; step < options.steps; ++step) {
    LocalStepRecord record;
    record.step = step;
    for (int64_t k = 0; k < per_step; ++k) {
      ASSIGN_OR_RETURN(compute::Batch batch, data->GetBatch(step * per_step + k, rank, world_size));
      const bool sync = k + 1 == per_step;
      ASSIGN_OR_RETURN(StepStats stats, runtime->RunStep(sync ? synced : micro, batch));
      record.loss += stats.loss / static_cast<double>(per_step);
      record.stats.compute_seconds += stats.compute_seconds;
      record.stats.exposed_comm_seconds += stats.exposed_comm_seconds;
      record.stats.optimizer_seconds += stats.optimizer_seconds;
      if (sync) record.stats.grad_norm = stats.grad_norm;
    }
    record.stats.loss = record.loss;
    if (on_step) on_step(record);
    result.steps.push_back(record);
  }
  result.peak_unsharded_bytes = runtime->memory().peak(MemoryKind::kUnshardedParams);
  result.peak_live_units = runtime->peak_live_units();
  result.same_host_collectives = runtime->same_host_collectives();
  if (options.summon_final_params) {
    ASSIGN_OR_RETURN(result.final_params, runtime->SummonFullParams());
  }
  return result;
}

}  // namespace flatshard
