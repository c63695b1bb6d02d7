#include "coordinator/async_save_await.h"

#include <algorithm>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace flatshard {
namespace {

// How long one probe may take: a live worker answers GetStatus in
// milliseconds, whatever its write does.
constexpr absl::Duration kProbeTimeout = absl::Seconds(1);
// How long the last look before a stall may wait (nor more than an
// interval): a write that has just ended answers at once.
constexpr absl::Duration kLastLook = absl::Milliseconds(100);

// The worker's answer for a write still running: its own "still writing"
// and the call's deadline alike.
bool StillWriting(const absl::StatusOr<v1::CommandResult>& result) {
  return !result.ok() && result.status().code() == absl::StatusCode::kDeadlineExceeded;
}

}  // namespace

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
    if (!StillWriting(result) || absl::Now() >= deadline) return {std::move(result), {}};
    std::optional<uint64_t> progress;
    if (absl::StatusOr<v1::GetStatusResponse> status =
            worker.GetStatus(std::min(deadline, absl::Now() + kProbeTimeout));
        status.ok()) {
      // A worker from before save_progress cannot say how its write goes:
      // it is awaited unwatched, as it was then.
      if (!status->has_save_progress()) return {worker.AwaitSave(directory, deadline), {}};
      progress = status->save_progress();
    }
    const StallWatch::Clock::time_point now = StallWatch::Clock::now();
    watch.Observe(rank, progress, now);
    if (std::optional<StallWatch::Stall> stall = watch.Stalled(now)) {
      // A last look: the write may have ended since the call above (its
      // final fsync moves no counter), and a rank failed wrongly costs a
      // recovery.
      result = worker.AwaitSave(directory,
                                std::min(deadline, absl::Now() + std::min(interval, kLastLook)));
      if (!StillWriting(result)) return {std::move(result), {}};
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
