// One call to each of many workers, all in flight at once, with no thread
// per worker: each call is started asynchronously, then the caller waits once
// for every answer. An abort or a probe then costs one round trip (or, for a
// dead worker, one timeout) whatever the world size, and holds one thread:
// at 16,384 workers a thread per call was 16,384 threads for one abort
// (docs/performance.md, the coordinator at scale).
#ifndef FLATSHARD_COORDINATOR_WORKER_FAN_OUT_H_
#define FLATSHARD_COORDINATOR_WORKER_FAN_OUT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include "coordinator/worker_client.h"
#include "flatshard/v1/worker.pb.h"

namespace flatshard {

// Every worker's GetStatus answer (or its error), by position in `workers`.
std::vector<absl::StatusOr<v1::GetStatusResponse>> GetStatusAll(
    absl::Span<WorkerClient* const> workers, absl::Time deadline);

// Aborts `epoch` on every worker; each one's outcome, by position.
std::vector<absl::Status> AbortAll(absl::Span<WorkerClient* const> workers, uint64_t epoch,
                                   const std::string& reason, absl::Time deadline);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_WORKER_FAN_OUT_H_
