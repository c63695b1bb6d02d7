// Awaiting one rank's async save (WorkerService.AwaitSave) while watching
// that its background write moves (docs/fault-tolerance.md, "Stalled
// ranks"). Steps run on beside the write and move the worker's main
// counter, so the write is read by its own, GetStatusResponse.save_progress.
// Unlike a batch's straggler, a write is watched from the start: it waits
// for no peer (each rank writes its own file, or its own regions of the
// FULL file, from the snapshot the save batch took), so a still write is a
// stuck one whatever the other ranks do. The wait is cut into the
// StallWatch's probe intervals, each an AwaitSave call of its own (the
// worker keeps the outcome until it is collected), with one probe between
// them: no call outlives an interval, and a healthy write costs a call and
// a probe every interval while it runs.
#ifndef FLATSHARD_COORDINATOR_ASYNC_SAVE_AWAIT_H_
#define FLATSHARD_COORDINATOR_ASYNC_SAVE_AWAIT_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "coordinator/stall_watch.h"
#include "coordinator/worker_client.h"
#include "flatshard/v1/worker.pb.h"

namespace flatshard {

struct AwaitedSave {
  // The worker's answer, or why there is none.
  absl::StatusOr<v1::CommandResult> result;
  // Set when the write stood still for the stall timeout (or its worker
  // answered no probe for as long); `result` is then DEADLINE_EXCEEDED,
  // saying so.
  std::optional<StallWatch::Stall> stall;
};

// Awaits `worker`'s write into `directory` (rank `rank`) until `deadline`.
// `stall_timeout` zero: not watched, one call. `give_up`, asked before each
// call, ends the wait as CANCELLED (the job failed meanwhile).
AwaitedSave AwaitAsyncSave(WorkerClient& worker, int rank, const std::string& directory,
                           absl::Time deadline, absl::Duration stall_timeout,
                           const std::function<bool()>& give_up);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_ASYNC_SAVE_AWAIT_H_
