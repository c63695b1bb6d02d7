#include "coordinator/async_save_await.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

namespace flatshard {

// How long one probe may take: a live worker answers GetStatus in
// milliseconds, whatever its write does.
constexpr absl::Duration kProbeTimeout = absl::Seconds(1);

AwaitedSave AwaitAsyncSave(WorkerClient& worker, int rank, const std::string& directory,
                           absl::Time deadline, absl::Duration stall_timeout,
                           const std::function<bool()>& give_up) {
  if (stall_timeout <= absl::ZeroDuration()) return {worker.AwaitSave(directory, deadline), {}};
  StallWatch watch(stall_timeout);
  const absl::Duration interval = watch.probe_interval();
  while (true) {
    if (give_up && give_up()) {
      return {absl::CancelledError(
                  absl::StrCat("the wait for the async save into '", directory, "' gave up")),
              {}};
    }
    absl::StatusOr<v1::CommandResult> result =
        worker.AwaitSave(directory, std::min(deadline, absl::Now() + interval));
    // Only "still writing" before the end is waited on; the worker says it
    // as DEADLINE_EXCEEDED, and so does the call's own deadline.
    if (result.ok() || result.status().code() != absl::StatusCode::kDeadlineExceeded ||
        absl::Now() >= deadline) {
      return {std::move(result), {}};
    }
    std::optional<uint64_t> progress;
    if (absl::StatusOr<v1::GetStatusResponse> status =
            worker.GetStatus(absl::Now() + kProbeTimeout);
        status.ok()) {
      progress = status->save_progress();
    }
    const StallWatch::Clock::time_point now = StallWatch::Clock::now();
    watch.Observe(rank, progress, now);
    if (std::optional<StallWatch::Stall> stall = watch.Stalled(now)) {
      return {
          absl::DeadlineExceededError(absl::StrCat(
              "async write into '", directory, "' ", DescribeStall(*stall, "save progress counter"),
              ": the write is stuck (a hung disk or mount); the coordinator's "
              "--stall-timeout is ",
              absl::FormatDuration(stall_timeout))),
          stall};
    }
  }
}

}  // namespace flatshard
