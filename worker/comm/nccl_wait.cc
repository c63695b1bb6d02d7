#include "worker/comm/nccl_wait.h"

#include <optional>
#include <string>

#include "absl/strings/str_cat.h"

#include "worker/device/cuda/cuda_status.h"

namespace flatshard {

absl::Status WaitForNccl(ncclComm_t comm, absl::string_view what, const PollingWait& wait) {
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
                            const PollingWait& wait) {
  if (result != ncclSuccess && result != ncclInProgress) {
    return cuda::NcclStatus(result, std::string(what).c_str());
  }
  return WaitForNccl(comm, what, wait);
}

}  // namespace flatshard
