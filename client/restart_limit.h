// How often a supervisor starts a failed daemon again: at most `burst`
// times within `window`, as systemd's StartLimitBurst/StartLimitIntervalSec.
// A daemon that starts but fails again and again (a worker that wedges on
// every collective, a coordinator that crashes on what its state dir
// holds), or one that cannot start at all, is then left down and said so,
// rather than restarted for ever.
#ifndef FLATSHARD_CLIENT_RESTART_LIMIT_H_
#define FLATSHARD_CLIENT_RESTART_LIMIT_H_

#include <deque>

#include "absl/time/time.h"

namespace flatshard {

class RestartLimit {
 public:
  RestartLimit(int burst, absl::Duration window) : burst_(burst), window_(window) {}

  // Whether a restart at `now` is allowed; one that is counts from then on.
  bool Allow(absl::Time now) {
    while (!restarts_.empty() && now - restarts_.front() > window_) restarts_.pop_front();
    if (static_cast<int>(restarts_.size()) >= burst_) return false;
    restarts_.push_back(now);
    return true;
  }
  // Whether a restart at `at` (now or later) would be allowed; counts none.
  bool WouldAllow(absl::Time at) const {
    int counted = 0;
    for (absl::Time restart : restarts_) counted += at - restart <= window_ ? 1 : 0;
    return counted < burst_;
  }
  // The restarts counted now (the one just allowed included).
  int count() const { return static_cast<int>(restarts_.size()); }
  int burst() const { return burst_; }
  absl::Duration window() const { return window_; }

 private:
  int burst_;
  absl::Duration window_;
  std::deque<absl::Time> restarts_;  // within the window, oldest first
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_RESTART_LIMIT_H_
