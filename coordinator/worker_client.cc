#include "coordinator/worker_client.h"

#include <utility>

#include "absl/synchronization/notification.h"

namespace flatshard {

absl::StatusOr<v1::GetStatusResponse> WorkerClient::GetStatus(absl::Time deadline) {
  absl::StatusOr<v1::GetStatusResponse> answer;
  absl::Notification answered;
  GetStatusAsync(deadline, [&](absl::StatusOr<v1::GetStatusResponse> a) {
    answer = std::move(a);
    answered.Notify();
  });
  answered.WaitForNotification();
  return answer;
}

absl::Status WorkerClient::Abort(uint64_t epoch, const std::string& reason, absl::Time deadline) {
  absl::Status status;
  absl::Notification answered;
  AbortAsync(epoch, reason, deadline, [&](absl::Status s) {
    status = std::move(s);
    answered.Notify();
  });
  answered.WaitForNotification();
  return status;
}

}  // namespace flatshard
