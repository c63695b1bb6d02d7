#include "coordinator/service/stalled_write_guard.h"

#include <utility>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace flatshard {

StalledWriteGuard::StalledWriteGuard(grpc::ServerContext* context, absl::Duration limit,
                                     std::string call)
    : context_(context), limit_(limit), call_(std::move(call)) {}

StalledWriteGuard::~StalledWriteGuard() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (watcher_.joinable()) watcher_.join();
}

bool StalledWriteGuard::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void StalledWriteGuard::Begin() {
  if (limit_ <= absl::ZeroDuration() || limit_ == absl::InfiniteDuration()) return;
  absl::MutexLock lock(&mu_);
  writing_ = ++writes_;
  started_ = absl::Now();
  if (!watcher_.joinable()) watcher_ = std::thread([this] { Watch(); });
}

void StalledWriteGuard::End() {
  absl::MutexLock lock(&mu_);
  writing_ = 0;
}

bool StalledWriteGuard::StoppedOrWriting() const { return stop_ || writing_ != 0; }

bool StalledWriteGuard::StoppedOrMoved() const { return stop_ || writing_ != watched_; }

void StalledWriteGuard::Watch() {
  absl::MutexLock lock(&mu_);
  while (!stop_) {
    if (writing_ == 0) {
      mu_.Await(absl::Condition(this, &StalledWriteGuard::StoppedOrWriting));
      continue;
    }
    // Wakes when this Write ends (or another began) or the guard stops.
    watched_ = writing_;
    if (mu_.AwaitWithDeadline(absl::Condition(this, &StalledWriteGuard::StoppedOrMoved),
                              started_ + limit_)) {
      continue;
    }
    cancelled_ = true;
    spdlog::warn("{} from {}: cancelled: the client read nothing for {} (--stalled-write-timeout)",
                 call_, context_->peer(), absl::FormatDuration(limit_));
    context_->TryCancel();
    return;
  }
}

}  // namespace flatshard
