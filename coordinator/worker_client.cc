#include "coordinator/worker_client.h"

#include <utility>

#include "coordinator/worker_fan_out.h"

namespace flatshard {

// A fan-out to one worker: the same wait, the same hand-off.
absl::Status WorkerClient::Configure(const v1::ConfigureRequest& request, absl::Time deadline) {
  WorkerClient* const self = this;
  return ConfigureAll({&self, 1}, {request}, deadline, {}).front();
}

absl::StatusOr<v1::GetStatusResponse> WorkerClient::GetStatus(absl::Time deadline) {
  WorkerClient* const self = this;
  return std::move(GetStatusAll({&self, 1}, deadline).front());
}

absl::Status WorkerClient::Abort(uint64_t epoch, const std::string& reason, absl::Time deadline) {
  WorkerClient* const self = this;
  return AbortAll({&self, 1}, epoch, reason, deadline).front();
}

}  // namespace flatshard
