// The job a worker runs now (WorkerServiceImpl::ActiveJob): what Configure
// built for one epoch, shared by the service's calls and its batches
// (worker_service.cc, worker_service_batches.cc). Internal to the service.
#ifndef FLATSHARD_WORKER_SERVICE_ACTIVE_JOB_H_
#define FLATSHARD_WORKER_SERVICE_ACTIVE_JOB_H_

#include <cstdint>
#include <memory>

#include "core/job_config.h"
#include "worker/compute/data_source.h"
#include "worker/runtime/batch_executor.h"
#include "worker/runtime/fsdp_runtime.h"
#include "worker/service/background_saves.h"
#include "worker/service/worker_service.h"

namespace flatshard {

struct WorkerServiceImpl::ActiveJob {
  explicit ActiveJob(AbortWatchdog* watchdog) : saves(watchdog) {}

  // Declared first: the runtime keeps references into the config's model.
  JobConfig config;
  int rank = 0;
  uint64_t epoch = 0;
  std::unique_ptr<compute::DataSource> data;
  std::unique_ptr<FsdpRuntime> runtime;
  std::unique_ptr<BatchExecutor> executor;
  // Last, so destroyed first: its destructor waits for the writes in flight
  // (aborted with the job), whose snapshots hold pinned memory of the
  // runtime's device.
  BackgroundSaves saves;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_SERVICE_ACTIVE_JOB_H_
