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
// a probe every interval while it runs. The calls are the client's
// asynchronous ones, each started from the previous one's callback, so a
// wait holds no thread: every rank's is driven by the caller's thread and
// the RPC library's callback threads.
#ifndef FLATSHARD_COORDINATOR_ASYNC_SAVE_AWAIT_H_
#define FLATSHARD_COORDINATOR_ASYNC_SAVE_AWAIT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

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
// `give_up`, asked before each call, ends the wait as CANCELLED (the job
// failed meanwhile, another rank's write stalled). With `stall_timeout`
// zero, or for a worker that sends no save_progress (built before it), the
// write is not watched, only awaited, in calls of at most a second.
AwaitedSave AwaitAsyncSave(WorkerClient& worker, int rank, const std::string& directory,
                           absl::Time deadline, absl::Duration stall_timeout,
                           const std::function<bool()>& give_up);

// Every rank's write into `directory` at once (`workers` by rank): a stuck
// rank is found at the stall timeout however long the others' writes take,
// not after them. The first write found stalled is handed to `on_stall` at
// once, on the caller's thread while the other waits run on (the job fails
// its rank there, and the recovery's abort ends the other writes), and ends
// the other waits (CANCELLED) at their next interval. `give_up` is asked
// before each call, on the caller's thread or the clients' callback
// threads: it must not block. The workers must outlive the call.
struct AwaitedSaves {
  std::vector<AwaitedSave> ranks;  // by rank
  std::optional<int> stalled;      // the rank handed to on_stall
};
AwaitedSaves AwaitAsyncSaves(const std::vector<std::shared_ptr<WorkerClient>>& workers,
                             const std::string& directory, absl::Time deadline,
                             absl::Duration stall_timeout, const std::function<bool()>& give_up,
                             const std::function<void(int rank, const AwaitedSave&)>& on_stall);

// What the ranks' answers make of the save: the results of the ranks that
// wrote their files (all of them), or the one failure to report. After a
// stall (`awaited.stalled`) no answer is read: the other waits were given
// up on, and the failure is `stalled` (the stall handed on), else
// `job_failure` (the job had failed before it was found). Otherwise a rank
// whose process is gone (UNAVAILABLE) is blamed first; then `job_failure`
// (the job failed meanwhile, naming the rank it lost: a rank that only lost
// its save because of it is not it); then a rank that answered without its
// write; then `refused` (a rank's refusal of the save batch), else the
// first rank whose write failed. An answer carrying another batch seq than
// `batch_seq` is not this save's: an outcome stays on a worker until its
// next save, so a failed save's name taken again, on a rank that refused
// this one's batch, finds the earlier one.
absl::StatusOr<std::vector<v1::CommandResult>> SettleAsyncSave(AwaitedSaves awaited,
                                                               uint64_t batch_seq,
                                                               const absl::Status& refused,
                                                               const absl::Status& stalled,
                                                               const absl::Status& job_failure);

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_ASYNC_SAVE_AWAIT_H_
