// Waiting on a non-blocking NCCL communicator. flatshard creates its NCCL
// communicators with `blocking = 0` (ncclConfig_t), so that no NCCL call can
// hold a worker thread forever: ncclCommInitRankConfig waiting for a rank that
// died before it joined, ncclCommSplit, or a collective's first enqueue
// connecting to a dead peer. Such a call returns ncclInProgress at once; the
// communicator's state (ncclCommGetAsyncError) says ncclInProgress until the
// work ends, then ncclSuccess or the error. Until then the caller may call
// nothing on the communicator but ncclCommGetAsyncError and ncclCommAbort.
//
// WaitForNccl polls that state, backing off from 50 us to `poll` (an
// initialization takes tens of milliseconds to seconds, an enqueue
// microseconds), and gives up when asked to abort or at the deadline. It
// never aborts the communicator itself: ncclCommAbort frees it, and only its
// owner knows whether another thread still holds it.
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
  absl::Duration poll = absl::Milliseconds(20);  // the longest pause between polls
  // Why to stop waiting now, if anything asks to (an abort's reason).
  std::function<std::optional<std::string>()> aborted;
  // What the wait is for, in a DEADLINE_EXCEEDED's message ("a peer died or
  // hangs").
  absl::string_view waiting_for = "a peer";
};

// OK once `comm`'s pending work ended well. ABORTED (with the reason) when
// `wait.aborted` answered, DEADLINE_EXCEEDED at the deadline, UNAVAILABLE
// with NCCL's error and its last error message when the work failed.
absl::Status WaitForNccl(ncclComm_t comm, absl::string_view what, const NcclWait& wait);

// The status of an NCCL call on a non-blocking communicator: its result when
// it ended in the call, else (ncclInProgress) what WaitForNccl says.
absl::Status NcclCallStatus(ncclComm_t comm, ncclResult_t result, absl::string_view what,
                            const NcclWait& wait);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_NCCL_WAIT_H_
