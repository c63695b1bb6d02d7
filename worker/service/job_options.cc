#include "worker/service/job_options.h"

#include <filesystem>
#include <memory>

#include "core/status_macros.h"
#include "worker/compute/model.h"

namespace flatshard {

FsdpOptions FsdpOptionsFromJob(const JobConfig& job) {
  FsdpOptions o;
  const ShardingSettings& s = job.sharding;
  o.strategy = s.strategy;
  o.hybrid_shard_group_size = s.hybrid_shard_group_size;
  o.use_orig_params = s.use_orig_params;
  o.param_dtype = s.param_dtype;
  o.reduce_dtype = s.reduce_dtype;
  o.backward_prefetch = s.backward_prefetch;
  o.forward_prefetch = s.forward_prefetch;
  o.limit_all_gathers = s.limit_all_gathers;
  o.sync_module_states = s.sync_module_states;
  o.cpu_offload = s.cpu_offload;
  switch (job.optimizer.kind) {
    case OptimizerSettings::Kind::kSgd:
      o.optimizer.kind = OptimizerConfig::Kind::kSgd;
      break;
    case OptimizerSettings::Kind::kAdam:
      o.optimizer.kind = OptimizerConfig::Kind::kAdam;
      break;
    case OptimizerSettings::Kind::kAdamW:
      o.optimizer.kind = OptimizerConfig::Kind::kAdamW;
      break;
  }
  o.optimizer.sgd = job.optimizer.sgd;
  o.optimizer.adam = job.optimizer.adam;
  o.max_grad_norm = job.optimizer.max_grad_norm;
  o.grad_norm_type = job.optimizer.grad_norm_type;
  o.seed = job.seed;
  return o;
}

absl::StatusOr<compute::DataSourceOptions> DataOptionsFromJob(const JobConfig& job,
                                                              const std::string& data_dir) {
  ASSIGN_OR_RETURN(ModelIndex index, IndexModel(job.model));
  ASSIGN_OR_RETURN(std::unique_ptr<compute::Model> model,
                   compute::Model::Create(job.model, index, compute::LossKind::kMse));
  compute::DataSourceOptions o;
  ASSIGN_OR_RETURN(o.kind, compute::ParseDataKind(job.data.kind));
  o.global_batch_size = job.data.global_batch_size;
  o.seq_len = model->takes_token_ids() ? job.data.sequence_length : 1;
  o.seed = job.data.seed;
  o.input_features = model->input_features();
  o.output_features = model->output_features();
  o.vocab_size = model->vocab_size();
  if (o.kind == compute::DataKind::kNpy) {
    o.path = (std::filesystem::path(data_dir) / job.data.path).string();
  }
  return o;
}

}  // namespace flatshard
