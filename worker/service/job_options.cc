#include "worker/service/job_options.h"

#include <filesystem>
#include <memory>

#include "core/status_macros.h"
#include "worker/compute/model.h"

namespace flatshard {

RuntimeOptions RuntimeOptionsFromJob(const JobConfig& job) {
  RuntimeOptions options;
  options.sharding = job.sharding;
  options.optimizer = job.optimizer;
  options.seed = job.seed;
  options.peer_snapshots = job.checkpoints.in_memory_every_steps > 0;
  return options;
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
