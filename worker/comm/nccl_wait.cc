#include "worker/comm/nccl_wait.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "worker/device/cuda/cuda_status.h"

namespace flatshard {

absl::Status WaitForNccl(ncclComm_t comm, absl::string_view what, const NcclWait& wait) {
  absl::Duration pause = absl::Microseconds(50);
  while (true) {
    ncclResult_t state = ncclInProgress;
    if (const ncclResult_t polled = ncclCommGetAsyncError(comm, &state); polled != ncclSuccess) {
      return cuda::NcclStatus(polled, "ncclCommGetAsyncError");
    }
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) {
      const char* last = ncclGetLastError(comm);
      return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(state),
                                                 last != nullptr && *last != '\0' ? ": " : "",
                                                 last != nullptr ? last : ""));
    }
    if (wait.aborted) {
      if (std::optional<std::string> reason = wait.aborted(); reason.has_value()) {
        return absl::AbortedError(absl::StrCat(what, " aborted: ", *reason));
      }
    }
    const absl::Time now = absl::Now();
    if (now >= wait.deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat(what, " did not complete in time (waiting for ", wait.waiting_for, ")"));
    }
    absl::SleepFor(std::min(pause, wait.deadline - now));
    pause = std::min(pause * 2, wait.poll);
  }
}

absl::Status NcclCallStatus(ncclComm_t comm, ncclResult_t result, absl::string_view what,
                            const NcclWait& wait) {
  if (result == ncclInProgress) return WaitForNccl(comm, what, wait);
  return cuda::NcclStatus(result, std::string(what).c_str());
}

}  // namespace flatshard
