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
// The waits are PollingWait's (worker/comm/polling_wait.h): a collective's
// enqueue yields for NCCL's thread, an initialization or a split sleeps. They
// never abort the communicator themselves: ncclCommAbort frees it, and only
// its owner knows whether another thread still holds it.
#ifndef FLATSHARD_WORKER_COMM_NCCL_WAIT_H_
#define FLATSHARD_WORKER_COMM_NCCL_WAIT_H_

#include <nccl.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "worker/comm/polling_wait.h"

namespace flatshard {

// OK once `comm`'s pending work ended well; UNAVAILABLE with NCCL's error and
// its last error message when it failed; else as WaitUntil.
absl::Status WaitForNccl(ncclComm_t comm, absl::string_view what, const PollingWait& wait);

// The status of an NCCL call `what` on the non-blocking `comm`: its error
// when it failed in the call, else what WaitForNccl says.
absl::Status NcclCallStatus(ncclComm_t comm, ncclResult_t result, absl::string_view what,
                            const PollingWait& wait);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_NCCL_WAIT_H_
