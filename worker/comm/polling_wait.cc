#include "worker/comm/polling_wait.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace flatshard {

absl::Status WaitUntil(const std::function<std::optional<absl::Status>()>& done,
                       absl::string_view what, const PollingWait& wait) {
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

}  // namespace flatshard
