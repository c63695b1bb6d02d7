#include "worker/device/host/host_event.h"

#include <utility>

namespace flatshard {

void HostEvent::Complete(absl::Status status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = std::move(status);
    when_ = std::chrono::steady_clock::now();
    done_ = true;
  }
  cv_.notify_all();
}

bool HostEvent::done() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

std::optional<absl::Status> HostEvent::StatusIfDone() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return std::nullopt;
  return status_;
}

absl::Status HostEvent::Synchronize() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return done_; });
  return status_;
}

absl::StatusOr<double> HostEvent::SecondsSince(const Event& start) const {
  const auto* other = dynamic_cast<const HostEvent*>(&start);
  if (other == nullptr || other->device_ != device_) {
    return absl::InvalidArgumentError("SecondsSince: the events belong to different devices");
  }
  std::chrono::steady_clock::time_point begin;
  {
    std::lock_guard<std::mutex> lock(other->mu_);
    if (!other->done_) return absl::FailedPreconditionError("SecondsSince: start is not complete");
    begin = other->when_;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!done_) return absl::FailedPreconditionError("SecondsSince: the event is not complete");
  return std::chrono::duration<double>(when_ - begin).count();
}

}  // namespace flatshard
