// Waiting on a non-blocking NCCL communicator. flatshard creates its NCCL
// communicators with `blocking = 0` (ncclConfig_t), so that no NCCL call can
// hold a worker thread forever: ncclCommInitRankConfig waiting for a rank that
// died before it joined, ncclCommSplit, or a collective's first enqueue
// connecting to a dead peer. Such a call returns at once, and the
// communicator's state (ncclCommGetAsyncError) says ncclInProgress until the
// work ends, then ncclSuccess or the error; until then the caller may call
// nothing on the communicator but ncclCommGetAsyncError and ncclCommAbort.
// A call's own result is not enough: ncclCommSplit returns ncclSuccess while
// its split still runs, so every call is followed by a look at the state.
//
// A wait polls, yielding the thread for up to `NcclWait::yield_for` (a
// collective's enqueue: NCCL's own thread finishes it within microseconds,
// and a sleep would add its own latency to every collective), then sleeping,
// backing off from 50 us to `poll` (an initialization takes tens of
// milliseconds to seconds). It gives up when asked to abort or at the
// deadline. It never aborts the communicator itself: ncclCommAbort frees it,
// and only its owner knows whether another thread still holds it.
#ifndef FLATSHARD_WORKER_COMM_NCCL_WAIT_H_
#define FLATSHARD_WORKER_COMM_NCCL_WAIT_H_

#include <functional>
#include <optional>
#include <string>

#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace flatshard {

struct NcclWait {
  absl::Time deadline = absl::InfiniteFuture();
  absl::Duration yield_for = absl::ZeroDuration();  // polling without sleeping
  absl::Duration poll = absl::Milliseconds(20);     // the longest sleep between polls
  // Why to stop waiting now, if anything asks to (an abort's reason).
  std::function<std::optional<std::string>()> aborted;
  // What the wait is for, in a DEADLINE_EXCEEDED's message ("a peer: one
  // died or hangs").
  absl::string_view waiting_for = "a peer";
};

// Polls `done` (nullopt: not yet; else the outcome) as NcclWait says until it
// answers. ABORTED (with the reason) when `wait.aborted` answered first,
// DEADLINE_EXCEEDED at the deadline; both name `what`.
absl::Status WaitUntil(const std::function<std::optional<absl::Status>()>& done,
                       absl::string_view what, const NcclWait& wait);

// OK once `comm`'s pending work ended well; UNAVAILABLE with NCCL's error and
// its last error message when it failed; else as WaitUntil.
absl::Status WaitForNccl(ncclComm_t comm, absl::string_view what, const NcclWait& wait);

// The status of an NCCL call `what` on the non-blocking `comm`: its error
// when it failed in the call, else what WaitForNccl says.
absl::Status NcclCallStatus(ncclComm_t comm, ncclResult_t result, absl::string_view what,
                            const NcclWait& wait);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_NCCL_WAIT_H_
