// A wait that can only poll: for work another library's thread finishes and
// reports through a state to be read (a non-blocking NCCL communicator,
// worker/comm/nccl_wait.h). It yields the thread for up to `yield_for` (work
// expected within microseconds, where a sleep would add its own length),
// then sleeps, backing off from 50 us to `poll` (work that takes
// milliseconds to seconds), and gives up when asked to abort or at the
// deadline. Device-free, so that it is tested on every machine.
#ifndef FLATSHARD_WORKER_COMM_POLLING_WAIT_H_
#define FLATSHARD_WORKER_COMM_POLLING_WAIT_H_

#include <functional>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flatshard {

struct PollingWait {
  absl::Time deadline = absl::InfiniteFuture();
  absl::Duration yield_for = absl::ZeroDuration();  // polling without sleeping
  absl::Duration poll = absl::Milliseconds(20);     // the longest sleep between polls
  // Why to stop waiting now, if anything asks to (an abort's reason).
  std::function<std::optional<std::string>()> aborted;
  // What the wait is for, in a DEADLINE_EXCEEDED's message ("a peer: one
  // died or hangs").
  absl::string_view waiting_for = "a peer";
};

// Polls `done` (nullopt: not yet; else the outcome, returned) as `wait` says.
// ABORTED with the reason when `wait.aborted` answers first, DEADLINE_EXCEEDED
// at the deadline; both name `what`. `done` is asked once more before either,
// so work that ended meanwhile is never reported as given up on.
absl::Status WaitUntil(const std::function<std::optional<absl::Status>()>& done,
                       absl::string_view what, const PollingWait& wait);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_POLLING_WAIT_H_
