#include "worker/comm/nccl_wait.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

#include "worker/device/cuda/cuda_status.h"

namespace flatshard {

absl::Status WaitUntil(const std::function<std::optional<absl::Status>()>& done,
                       absl::string_view what, const NcclWait& wait) {
  const absl::Time yield_until = absl::Now() + wait.yield_for;
  absl::Duration pause = absl::Microseconds(50);
  while (true) {
    if (std::optional<absl::Status> outcome = done(); outcome.has_value()) return *outcome;
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
    if (now < yield_until) {
      std::this_thread::yield();
      continue;
    }
    absl::SleepFor(std::min(pause, wait.deadline - now));
    pause = std::min(pause * 2, wait.poll);
  }
}

absl::Status WaitForNccl(ncclComm_t comm, absl::string_view what, const NcclWait& wait) {
  return WaitUntil(
      [&]() -> std::optional<absl::Status> {
        ncclResult_t state = ncclInProgress;
        if (const ncclResult_t polled = ncclCommGetAsyncError(comm, &state);
            polled != ncclSuccess) {
          return cuda::NcclStatus(polled, "ncclCommGetAsyncError");
        }
        if (state == ncclInProgress) return std::nullopt;
        if (state == ncclSuccess) return absl::OkStatus();
        const char* last = ncclGetLastError(comm);
        return absl::UnavailableError(absl::StrCat(what, ": ", ncclGetErrorString(state),
                                                   last != nullptr && *last != '\0' ? ": " : "",
                                                   last != nullptr ? last : ""));
      },
      what, wait);
}

absl::Status NcclCallStatus(ncclComm_t comm, ncclResult_t result, absl::string_view what,
                            const NcclWait& wait) {
  if (result != ncclSuccess && result != ncclInProgress) {
    return cuda::NcclStatus(result, std::string(what).c_str());
  }
  return WaitForNccl(comm, what, wait);
}

}  // namespace flatshard
