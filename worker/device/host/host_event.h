// An Event of a host-executed stream (CPU and simulated devices): completed by
// the stream when its work reaches it, with the stream's status then and a
// timestamp, so SecondsSince measures when work actually ran, not when it was
// issued.
#ifndef FLATSHARD_WORKER_DEVICE_HOST_HOST_EVENT_H_
#define FLATSHARD_WORKER_DEVICE_HOST_HOST_EVENT_H_

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "worker/device/stream.h"

namespace flatshard {

// Always owned by a shared_ptr (streams keep the events they wait on alive).
class HostEvent : public Event, public std::enable_shared_from_this<HostEvent> {
 public:
  explicit HostEvent(const Device* device) : device_(device) {}

  void Complete(absl::Status status);
  bool done() const;
  // The status once complete; nullopt while pending.
  std::optional<absl::Status> StatusIfDone() const;
  const Device* device() const { return device_; }

  absl::Status Synchronize() override;
  absl::StatusOr<double> SecondsSince(const Event& start) const override;

 private:
  const Device* device_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
  absl::Status status_;
  std::chrono::steady_clock::time_point when_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_HOST_HOST_EVENT_H_
