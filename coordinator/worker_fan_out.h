// One call to each of many workers, all in flight at once, with no thread
// per worker: each call is started asynchronously, then the caller waits once
// for every answer. An abort or a probe then costs one round trip (or, for a
// dead worker, one timeout) whatever the world size, and holds one thread:
// at 16,384 workers a thread per call was 16,384 threads for one abort
// (docs/performance.md, the coordinator at scale).
#ifndef FLATSHARD_COORDINATOR_WORKER_FAN_OUT_H_
#define FLATSHARD_COORDINATOR_WORKER_FAN_OUT_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

#include "coordinator/worker_client.h"
#include "flatshard/v1/worker.pb.h"

namespace flatshard {

// Configures worker i with requests[i], all at once: the ranks rendezvous, so
// every call is held until the last rank has arrived. `failed`, when set,
// runs for each failure as it comes in (on any thread, this one included,
// with nothing of the fan-out's locked), so that the caller can cancel the
// others at once instead of letting them wait for the rank that will never
// arrive; a worker not yet started by then is not started at all, and reads
// CANCELLED. Each one's outcome, by position.
std::vector<absl::Status> ConfigureAll(
    absl::Span<WorkerClient* const> workers, std::vector<v1::ConfigureRequest> requests,
    absl::Time deadline, const std::function<void(size_t, const absl::Status&)>& failed);

// Every worker's GetStatus answer (or its error), by position in `workers`.
std::vector<absl::StatusOr<v1::GetStatusResponse>> GetStatusAll(
    absl::Span<WorkerClient* const> workers, absl::Time deadline);

// Aborts `epoch` on every worker; each one's outcome, by position.
std::vector<absl::Status> AbortAll(absl::Span<WorkerClient* const> workers, uint64_t epoch,
                                   const std::string& reason, absl::Time deadline);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_WORKER_FAN_OUT_H_
