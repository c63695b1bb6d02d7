#include "coordinator/async_save_await.h"

#include <algorithm>
#include <atomic>
#include <cassert>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/status_proto.h"

#include "coordinator/worker_fan_out.h"

namespace flatshard {
namespace {

// How long one probe may take: a live worker answers GetStatus in
// milliseconds, whatever its write does (every rank's chain probes at about
// the same time, so each is given FanOutTimeout's more).
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

// What the waits of one AwaitAsyncSaves share: their outcomes, and the first
// stall, which ends the other waits. The waits run in the workers' callbacks;
// the caller's thread only waits here, and hands the stall on.
class SaveWaits {
 public:
  SaveWaits(size_t ranks, std::function<bool()> give_up)
      : give_up_(std::move(give_up)), running_(ranks), outcomes_(ranks) {}

  // Asked before each call: a stall found, or the caller gave up.
  bool Stopping() const { return stalled_.load() >= 0 || (give_up_ && give_up_()); }

  // The wait in slot `slot` ended with `save`.
  void Finish(size_t slot, AwaitedSave save) {
    std::lock_guard<std::mutex> lock(mu_);
    if (save.stall.has_value() && stalled_.load() < 0) stalled_.store(static_cast<int>(slot));
    outcomes_[slot] = std::move(save);
    --running_;
    changed_.notify_all();
  }

  // Blocks until every wait ended. The first stall goes to `on_stall` (if
  // set) as soon as it is found, on this thread.
  AwaitedSaves Wait(const std::function<void(int rank, const AwaitedSave&)>& on_stall) {
    std::unique_lock<std::mutex> lock(mu_);
    const auto stalled_slot = [this]() -> std::optional<size_t> {
      const int slot = stalled_.load();
      if (slot < 0) return std::nullopt;
      return static_cast<size_t>(slot);
    };
    bool handed_on = false;
    while (true) {
      changed_.wait(lock, [&] { return running_ == 0 || (stalled_slot() && !handed_on); });
      if (!stalled_slot() || handed_on) break;
      handed_on = true;
      // Its outcome is final: only the other slots are written meanwhile.
      const AwaitedSave& stuck = outcomes_[*stalled_slot()];
      lock.unlock();
      if (on_stall) on_stall(stuck.stall->rank, stuck);
      lock.lock();
    }
    AwaitedSaves awaited;
    if (std::optional<size_t> slot = stalled_slot()) {
      awaited.stalled = outcomes_[*slot].stall->rank;
    }
    awaited.ranks = std::move(outcomes_);
    return awaited;
  }

 private:
  const std::function<bool()> give_up_;
  std::atomic<int> stalled_{-1};  // the first stalled slot; written under mu_
  std::mutex mu_;
  std::condition_variable changed_;
  size_t running_;                     // guarded by mu_
  std::vector<AwaitedSave> outcomes_;  // by slot; guarded by mu_
};

// One rank's wait: a chain of calls, each started from the previous one's
// callback (an AwaitSave of at most an interval, then a probe), so it holds
// no thread between them. Its steps run one at a time, through Run, so its
// state needs no lock of its own.
class RankWait : public std::enable_shared_from_this<RankWait> {
 public:
  // `ranks`: how many chains probe at about the same time (FanOutTimeout).
  RankWait(std::shared_ptr<SaveWaits> waits, size_t slot, WorkerClient& worker, int rank,
           std::string directory, absl::Time deadline, absl::Duration stall_timeout, size_t ranks)
      : waits_(std::move(waits)),
        slot_(slot),
        worker_(worker),
        rank_(rank),
        directory_(std::move(directory)),
        deadline_(deadline),
        stall_timeout_(stall_timeout),
        // Unwatched (the detector off, or a worker from before
        // save_progress, which cannot say how its write goes) the write is
        // still awaited in intervals, so that a failed job or another
        // rank's stall ends the wait.
        watched_(stall_timeout > absl::ZeroDuration()),
        watch_(watched_ ? stall_timeout : absl::Seconds(1)),
        interval_(watched_ ? watch_.probe_interval() : kUnwatchedInterval),
        probe_timeout_(FanOutTimeout(kProbeTimeout, ranks)) {}

  // Starts the wait.
  void Start() {
    Run([self = shared_from_this()] { self->Call(); });
  }

 private:
  // Runs `step` now, or, when a step of this chain is still running (its
  // call answered before the step that started it returned, maybe on the
  // same thread), right after that one on its thread: the chain loops
  // instead of recursing however its client delivers answers. A chain has
  // one call in flight, so at most one step waits.
  void Run(std::function<void()> step) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (running_) {
        assert(!queued_ && "a chain has one call in flight, so one step waits at most");
        queued_ = std::move(step);
        return;
      }
      running_ = true;
    }
    while (true) {
      step();
      std::lock_guard<std::mutex> lock(mu_);
      if (!queued_) {
        running_ = false;
        return;
      }
      step = std::exchange(queued_, nullptr);
    }
  }

  // The next call, or the end of the wait when the waits stop.
  void Call() {
    if (waits_->Stopping()) {
      End({absl::CancelledError(
               absl::StrCat("the wait for the async save into '", directory_, "' gave up")),
           {}});
      return;
    }
    worker_.AwaitSave(directory_, std::min(deadline_, absl::Now() + interval_),
                      [self = shared_from_this()](absl::StatusOr<v1::CommandResult> result) {
                        self->Run([self, result = std::move(result)]() mutable {
                          self->Answered(std::move(result));
                        });
                      });
  }

  void Answered(absl::StatusOr<v1::CommandResult> result) {
    if (!StillWriting(result) || absl::Now() >= deadline_) {
      End({std::move(result), {}});
    } else if (!watched_) {
      Call();
    } else {
      worker_.GetStatusAsync(
          std::min(deadline_, absl::Now() + probe_timeout_),
          [self = shared_from_this()](absl::StatusOr<v1::GetStatusResponse> status) {
            self->Run([self, status = std::move(status)] { self->Probed(status); });
          });
    }
  }

  void Probed(const absl::StatusOr<v1::GetStatusResponse>& status) {
    std::optional<uint64_t> progress;
    if (status.ok()) {
      if (!status->has_save_progress()) {
        watched_ = false;
        Call();
        return;
      }
      progress = status->save_progress();
    }
    const StallWatch::Clock::time_point now = StallWatch::Clock::now();
    watch_.Observe(rank_, progress, now);
    std::optional<StallWatch::Stall> stall = watch_.Stalled(now);
    if (!stall.has_value()) {
      Call();
      return;
    }
    // A last look: the write may have ended since the call before (its
    // final fsync moves no counter), and a rank failed wrongly costs a
    // recovery.
    worker_.AwaitSave(
        directory_, std::min(deadline_, absl::Now() + std::min(interval_, kLastLook)),
        [self = shared_from_this(), stall = *stall](absl::StatusOr<v1::CommandResult> result) {
          self->Run([self, stall, result = std::move(result)]() mutable {
            self->LastLooked(std::move(result), stall);
          });
        });
  }

  void LastLooked(absl::StatusOr<v1::CommandResult> result, const StallWatch::Stall& stall) {
    if (!StillWriting(result)) {
      End({std::move(result), {}});
      return;
    }
    End({absl::DeadlineExceededError(absl::StrCat(
             "async write into '", directory_, "' ", DescribeStall(stall, "save progress counter"),
             ": the write is stuck (a hung disk or mount); the coordinator's --stall-timeout is ",
             absl::FormatDuration(stall_timeout_))),
         stall});
  }

  void End(AwaitedSave save) { waits_->Finish(slot_, std::move(save)); }

  const std::shared_ptr<SaveWaits> waits_;
  const size_t slot_;
  WorkerClient& worker_;
  const int rank_;
  const std::string directory_;
  const absl::Time deadline_;
  const absl::Duration stall_timeout_;
  bool watched_;
  StallWatch watch_;
  const absl::Duration interval_;
  const absl::Duration probe_timeout_;
  std::mutex mu_;
  bool running_ = false;          // a step runs; guarded by mu_
  std::function<void()> queued_;  // the step to run after it; guarded by mu_
};

}  // namespace

AwaitedSave AwaitAsyncSave(WorkerClient& worker, int rank, const std::string& directory,
                           absl::Time deadline, absl::Duration stall_timeout,
                           const std::function<bool()>& give_up) {
  auto waits = std::make_shared<SaveWaits>(1, give_up);
  std::make_shared<RankWait>(waits, 0, worker, rank, directory, deadline, stall_timeout, 1)
      ->Start();
  return std::move(waits->Wait({}).ranks[0]);
}

AwaitedSaves AwaitAsyncSaves(const std::vector<std::shared_ptr<WorkerClient>>& workers,
                             const std::string& directory, absl::Time deadline,
                             absl::Duration stall_timeout, const std::function<bool()>& give_up,
                             const std::function<void(int rank, const AwaitedSave&)>& on_stall) {
  auto waits = std::make_shared<SaveWaits>(workers.size(), give_up);
  for (size_t r = 0; r < workers.size(); ++r) {
    std::make_shared<RankWait>(waits, r, *workers[r], static_cast<int>(r), directory, deadline,
                               stall_timeout, workers.size())
        ->Start();
  }
  return waits->Wait(on_stall);
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
