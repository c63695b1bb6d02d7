#include "coordinator/drain_wait.h"

#include <algorithm>
#include <chrono>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

namespace flatshard {

bool WaitsForDrain(const absl::StatusOr<v1::GetStatusResponse>& answer) {
  return answer.ok() && answer->draining_ms() > 0 && answer->abort_grace_ms() > 0;
}

absl::StatusOr<v1::GetStatusResponse> AwaitDrained(absl::StatusOr<v1::GetStatusResponse> first,
                                                   const StatusProbe& probe,
                                                   const std::function<bool()>& stopping,
                                                   absl::string_view who,
                                                   const DrainWaitOptions& options) {
  if (!WaitsForDrain(first)) return first;
  const absl::Duration left =
      std::clamp(absl::Milliseconds(first->abort_grace_ms() - first->draining_ms()),
                 absl::ZeroDuration(), options.cap);
  // Steady: a wall-clock step must not cut the verdict's wait short.
  const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(left) +
                     absl::ToChronoNanoseconds(options.margin);
  absl::StatusOr<v1::GetStatusResponse> answer = std::move(first);
  while (answer.ok() && answer->draining_ms() > 0) {
    if (stopping && stopping()) return answer;
    if (std::chrono::steady_clock::now() >= until) {
      absl::Status wedged = absl::UnavailableError(absl::StrCat(
          who, ": its aborted work (a batch or an async save's write) has not let go for ",
          answer->draining_ms(), " ms, past its abort grace of ", answer->abort_grace_ms(),
          " ms: it is wedged and not kept"));
      spdlog::warn("{}", std::string(wedged.message()));
      return wedged;
    }
    absl::SleepFor(options.poll);  // polls one worker, bounded by its grace (and the cap)
    answer = probe();
  }
  return answer;
}

}  // namespace flatshard
