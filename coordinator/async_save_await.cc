#include "coordinator/async_save_await.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/status_proto.h"

namespace flatshard {
namespace {

// How long one probe may take: a live worker answers GetStatus in
// milliseconds, whatever its write does.
constexpr absl::Duration kProbeTimeout = absl::Seconds(1);
// How long one call may wait for a write nobody watches: how late a failed
// job or another rank's stall ends the wait.
constexpr absl::Duration kUnwatchedInterval = absl::Seconds(1);
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
  // Unwatched (the detector off, or a worker from before save_progress,
  // which cannot say how its write goes) the write is still awaited in
  // intervals, so that a failed job or another rank's stall ends the wait.
  bool watched = stall_timeout > absl::ZeroDuration();
  StallWatch watch(stall_timeout);
  const absl::Duration interval = watched ? watch.probe_interval() : kUnwatchedInterval;
  while (true) {
    if (give_up && give_up()) {
      return {absl::CancelledError(
                  absl::StrCat("the wait for the async save into '", directory, "' gave up")),
              {}};
    }
    absl::StatusOr<v1::CommandResult> result =
        worker.AwaitSave(directory, std::min(deadline, absl::Now() + interval));
    if (!StillWriting(result) || absl::Now() >= deadline) return {std::move(result), {}};
    if (!watched) continue;
    std::optional<uint64_t> progress;
    if (absl::StatusOr<v1::GetStatusResponse> status =
            worker.GetStatus(std::min(deadline, absl::Now() + kProbeTimeout));
        status.ok()) {
      if (!status->has_save_progress()) {
        watched = false;
        continue;
      }
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

AwaitedSaves AwaitAsyncSaves(const std::vector<std::shared_ptr<WorkerClient>>& workers,
                             const std::string& directory, absl::Time deadline,
                             absl::Duration stall_timeout, const std::function<bool()>& give_up,
                             const std::function<void(int rank, const AwaitedSave&)>& on_stall) {
  AwaitedSaves awaited;
  awaited.ranks.resize(workers.size());
  std::atomic<int> stalled{-1};
  const std::function<bool()> stop = [&] { return stalled.load() >= 0 || (give_up && give_up()); };
  std::vector<std::thread> waits;
  waits.reserve(workers.size());
  for (size_t r = 0; r < workers.size(); ++r) {
    waits.emplace_back([&, r] {
      const int rank = static_cast<int>(r);
      AwaitedSave save =
          AwaitAsyncSave(*workers[r], rank, directory, deadline, stall_timeout, stop);
      int none = -1;
      // Only the first: one stuck write is enough to fail the job, and the
      // others' waits end at once after it, some of them stalled too.
      if (save.stall.has_value() && stalled.compare_exchange_strong(none, rank) && on_stall) {
        on_stall(rank, save);
      }
      awaited.ranks[r] = std::move(save);
    });
  }
  for (std::thread& t : waits) t.join();
  if (stalled.load() >= 0) awaited.stalled = stalled.load();
  return awaited;
}

absl::StatusOr<std::vector<v1::CommandResult>> SettleAsyncSave(AwaitedSaves awaited,
                                                               uint64_t batch_seq,
                                                               const absl::Status& refused,
                                                               const absl::Status& stalled,
                                                               const absl::Status& job_failure) {
  if (awaited.stalled.has_value()) {
    // The others' waits were given up on: their answers say nothing of
    // their writes. The stall handed on is the cause, unless the job had
    // failed for its own before it was found.
    if (!stalled.ok()) return stalled;
    if (!job_failure.ok()) return job_failure;
    return absl::InternalError(absl::StrCat("rank ", *awaited.stalled,
                                            "'s write stalled, and the commit says neither how "
                                            "nor that the job failed"));
  }
  std::vector<v1::CommandResult> written;
  absl::Status unreachable, lost, reported = refused;
  for (size_t r = 0; r < awaited.ranks.size(); ++r) {
    absl::StatusOr<v1::CommandResult>& result = awaited.ranks[r].result;
    if (result.ok() && result->seq() != batch_seq) {
      result = absl::FailedPreconditionError(
          absl::StrCat("its answer is for batch seq ", result->seq(), ", not ", batch_seq));
    }
    if (!result.ok()) {
      const bool gone = result.status().code() == absl::StatusCode::kUnavailable;
      absl::Status& slot = gone ? unreachable : lost;
      if (slot.ok()) {
        slot = absl::Status(
            result.status().code(),
            absl::StrCat("rank ", r, " did not finish its write: ", result.status().message()));
      }
    } else if (absl::Status s = StatusFromProto(result->checkpoint_status()); !s.ok()) {
      if (reported.ok()) {
        reported = absl::Status(s.code(), absl::StrCat("rank ", r, ": ", s.message()));
      }
    } else {
      written.push_back(*std::move(result));
    }
  }
  const absl::Status* const blame_order[] = {&unreachable, &job_failure, &lost, &reported};
  for (const absl::Status* failed : blame_order) {
    if (!failed->ok()) return *failed;
  }
  return written;
}

}  // namespace flatshard
