// What a recovery's probe does with a member whose aborted work (its batch,
// an async save's background write) is still running ("draining",
// GetStatusResponse.draining_ms). Such a member either lets go within
// moments (it was only between two checks of the abort) or is wedged, and
// then ends itself once its abort grace has passed
// (worker/service/abort_watchdog.h). Keeping it as a survivor at once would
// seat it in the next epoch, whose Configure would wait behind its stuck
// work and fail when it exits, spending a restart. So the probe waits for
// the verdict, bounded by the grace the worker reported.
#ifndef FLATSHARD_COORDINATOR_DRAIN_WAIT_H_
#define FLATSHARD_COORDINATOR_DRAIN_WAIT_H_

#include <functional>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

#include "flatshard/v1/worker.pb.h"

namespace flatshard {

struct DrainWaitOptions {
  absl::Duration poll = absl::Milliseconds(100);
  // Past the worker's grace: time for its exit to be seen (a probe timeout
  // and then some).
  absl::Duration margin = absl::Seconds(4);
  // Whatever grace a worker reports, a recovery waits no longer than this.
  absl::Duration cap = absl::Minutes(5);
};

using StatusProbe = std::function<absl::StatusOr<v1::GetStatusResponse>()>;

// Whether AwaitDrained would wait on `answer`: it drains, and its worker
// reported a grace after which it ends itself. A probe of many members asks
// them all at once and gives a thread only to those.
bool WaitsForDrain(const absl::StatusOr<v1::GetStatusResponse>& answer);

// `first` (a member's probe answer) if nothing drains, or the worker reports
// no grace (it never ends itself); else the answer once its work has let go,
// or the failed probe of a worker that ended itself. UNAVAILABLE naming `who`
// when it still drains past its grace plus the margin (wedged, yet alive).
// `stopping` is asked at every poll: true returns the last answer as it is.
absl::StatusOr<v1::GetStatusResponse> AwaitDrained(absl::StatusOr<v1::GetStatusResponse> first,
                                                   const StatusProbe& probe,
                                                   const std::function<bool()>& stopping,
                                                   absl::string_view who,
                                                   const DrainWaitOptions& options = {});

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_DRAIN_WAIT_H_
