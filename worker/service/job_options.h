// What a worker builds from a validated job (core/job_config): the runtime's
// options and the data set of its rank. The coordinator, the worker daemon and
// the tests that compare them with the local harness all derive both the same
// way, so the same job gives the same numbers on every path.
#ifndef FLATSHARD_WORKER_SERVICE_JOB_OPTIONS_H_
#define FLATSHARD_WORKER_SERVICE_JOB_OPTIONS_H_

#include <string>

#include "absl/status/statusor.h"

#include "core/job_config.h"
#include "worker/compute/data_source.h"
#include "worker/runtime/fsdp_runtime.h"

namespace flatshard {

// The runtime's options for `job`: its sharding and optimizer settings as they
// are, and its initialisation seed. The caller adds the runtime-only parts
// (loss, Gloo options, observer).
RuntimeOptions RuntimeOptionsFromJob(const JobConfig& job);

// `data_dir` roots a FILE data set's relative path.
absl::StatusOr<compute::DataSourceOptions> DataOptionsFromJob(const JobConfig& job,
                                                              const std::string& data_dir);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_JOB_OPTIONS_H_
