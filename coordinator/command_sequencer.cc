#include "coordinator/command_sequencer.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/command_batch.h"
#include "spdlog/spdlog.h"

#include "coordinator/worker_fan_out.h"
#include "core/status_macros.h"
#include "core/status_payloads.h"

namespace flatshard {
namespace {

// How long the post-mortem probes and aborts may take for one worker (a
// fan-out to many is given FanOutTimeout's more): live workers answer in
// milliseconds; a hung one must not delay the verdict much.
constexpr absl::Duration kProbeTimeout = absl::Seconds(1);

std::vector<WorkerClient*> RawPointers(const std::vector<std::shared_ptr<WorkerClient>>& workers) {
  std::vector<WorkerClient*> raw;
  raw.reserve(workers.size());
  for (const std::shared_ptr<WorkerClient>& w : workers) raw.push_back(w.get());
  return raw;
}

}  // namespace

CommandSequencer::CommandSequencer(std::vector<std::shared_ptr<WorkerClient>> workers,
                                   uint64_t epoch, BatchLimits limits, BatchObserver on_batch)
    : workers_(std::move(workers)),
      clients_(RawPointers(workers_)),
      epoch_(epoch),
      limits_(limits),
      on_batch_(std::move(on_batch)) {}

uint64_t CommandSequencer::last_seq() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_seq_;
}

absl::Status CommandSequencer::failure() const {
  std::lock_guard<std::mutex> lock(mu_);
  return failure_;
}

absl::Status CommandSequencer::Begin(v1::CommandBatch& batch) {
  std::unique_lock<std::mutex> lock(mu_);
  aborted_.wait(lock, [this] { return !aborting_; });
  if (!failure_.ok()) return failure_;
  // A batch built wrongly (no kind, malformed commands) is refused here,
  // before anything reaches a worker. One that carries its digest already
  // (MakeStepBatch's, from the program itself) keeps it: every worker
  // recomputes it from the content and refuses a mismatch.
  if (batch.kind_case() == v1::CommandBatch::KIND_NOT_SET || batch.digest().empty()) {
    ASSIGN_OR_RETURN(std::string digest, BatchDigest(batch));
    batch.set_digest(std::move(digest));
  }
  batch.set_job_epoch(epoch_);
  batch.set_seq(last_seq_ + 1);
  const BatchJournal journal = journal_;
  lock.unlock();
  if (journal) journal(batch);
  return absl::OkStatus();
}

void CommandSequencer::ResumeAfter(uint64_t last_seq) {
  std::lock_guard<std::mutex> lock(mu_);
  last_seq_ = last_seq;
}

void CommandSequencer::set_journal(BatchJournal journal) {
  std::lock_guard<std::mutex> lock(mu_);
  journal_ = std::move(journal);
}

void CommandSequencer::Fail(int rank, const absl::Status& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failure_.ok()) return;
    failure_ = rank < 0
                   ? reason
                   : WithFailedRank(PrefixStatus(absl::StrCat("rank ", rank, ": "), reason), rank);
    aborting_ = true;
  }
  for (const std::shared_ptr<WorkerClient>& worker : workers_) worker->CancelAll();
  AbortAll(std::string(reason.message()));
  std::lock_guard<std::mutex> lock(mu_);
  aborting_ = false;
  aborted_.notify_all();
}

void CommandSequencer::AbortAll(const std::string& reason) {
  // All at once (worker_fan_out.h): a dead worker's Abort takes its whole
  // timeout, and no other worker's waits behind it.
  (void)flatshard::AbortAll(clients_, epoch_, reason,
                            absl::Now() + FanOutTimeout(kProbeTimeout, clients_.size()));
}

std::optional<StallWatch::Stall> CommandSequencer::ProbeStragglers(const std::vector<int>& running,
                                                                   StallWatch& watch) {
  // All at once, as the aborts: a frozen worker's probe takes its timeout.
  std::vector<WorkerClient*> probed;
  probed.reserve(running.size());
  for (int r : running) probed.push_back(clients_[static_cast<size_t>(r)]);
  const std::vector<absl::StatusOr<v1::GetStatusResponse>> answers =
      GetStatusAll(probed, absl::Now() + FanOutTimeout(kProbeTimeout, probed.size()));
  const StallWatch::Clock::time_point now = StallWatch::Clock::now();
  watch.Retain(running);
  for (size_t i = 0; i < running.size(); ++i) {
    watch.Observe(running[i],
                  answers[i].ok() ? std::optional<uint64_t>(answers[i]->progress()) : std::nullopt,
                  now);
  }
  return watch.Stalled(now);
}

absl::Status CommandSequencer::StallFailure(const v1::CommandBatch& batch,
                                            const StallWatch::Stall& stall, size_t finished,
                                            absl::Duration timeout) const {
  const WorkerClient& worker = *workers_[static_cast<size_t>(stall.rank)];
  return absl::DeadlineExceededError(
      absl::StrCat("its worker (", worker.address(), ") ", DescribeStall(stall, "progress counter"),
                   " while ", finished, " of ", workers_.size(), " ranks finished ",
                   BatchKindName(batch.kind_case()), " batch ", batch.seq(),
                   ": its work is stuck (a hung disk or mount, a deadlock); the coordinator's "
                   "--stall-timeout is ",
                   absl::FormatDuration(timeout)));
}

absl::Status CommandSequencer::Settle(const std::vector<absl::Status>& statuses, int first_failed) {
  std::vector<int> failed;
  if (first_failed >= 0) failed.push_back(first_failed);
  for (size_t r = 0; r < statuses.size(); ++r) {
    if (!statuses[r].ok() && static_cast<int>(r) != first_failed) {
      failed.push_back(static_cast<int>(r));
    }
  }
  if (failed.empty()) return absl::OkStatus();
  {
    // Fail() got there first (a missed heartbeat): that is the cause. The
    // batch fails only once Fail() has aborted every rank, so whoever sees
    // the failure finds the survivors' collectives already aborted.
    std::unique_lock<std::mutex> lock(mu_);
    aborted_.wait(lock, [this] { return !aborting_; });
    if (!failure_.ok()) return failure_;
  }
  // A rank that no longer answers is the cause; the others failed because
  // their collectives lost it. Otherwise the rank that failed first: the
  // others were aborted for it, or lost it in a collective.
  int blamed = failed.front();
  bool unreachable = false;
  std::vector<WorkerClient*> probed;
  probed.reserve(failed.size());
  for (int r : failed) probed.push_back(clients_[static_cast<size_t>(r)]);
  // All at once: the first in `failed` that does not answer is the cause.
  const std::vector<absl::StatusOr<v1::GetStatusResponse>> answers =
      GetStatusAll(probed, absl::Now() + FanOutTimeout(kProbeTimeout, probed.size()));
  for (size_t i = 0; i < failed.size(); ++i) {
    if (!answers[i].ok()) {
      blamed = failed[i];
      unreachable = true;
      break;
    }
  }
  const auto b = static_cast<size_t>(blamed);
  const absl::Status& cause = statuses[b];
  // Named in the message either way; blamed in the code (FailedRank, which
  // a recovery acts on) only on evidence: a batch that ran out of time fails
  // every rank at once, in no telling order, and an aborted or cancelled
  // rank failed for something else.
  const bool evident = unreachable || (cause.code() != absl::StatusCode::kDeadlineExceeded &&
                                       cause.code() != absl::StatusCode::kCancelled &&
                                       cause.code() != absl::StatusCode::kAborted);
  // A rank that no longer answers is UNAVAILABLE whatever its call said: a
  // call cancelled by its server's shutdown, or by AbortAll for a peer's
  // failure, is not a stop of the job (which recovery would give up on).
  absl::Status failure = WithFailedRank(
      absl::Status(unreachable ? absl::StatusCode::kUnavailable : cause.code(),
                   unreachable ? absl::StrCat("rank ", blamed, " (", workers_[b]->address(),
                                              ") is unreachable, its process died "
                                              "or its host is down: ",
                                              cause.message())
                               : absl::StrCat("rank ", blamed, " (", workers_[b]->address(),
                                              ") failed: ", cause.message())),
      evident ? blamed : -1);
  {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = failure;
  }
  AbortAll(std::string(failure.message()));
  return failure;
}

absl::StatusOr<std::vector<v1::CommandResult>> CommandSequencer::Run(
    v1::CommandBatch batch, const WhileRunning& while_running) {
  if (absl::Status s = Begin(batch); !s.ok()) return s;
  const size_t world = workers_.size();
  std::vector<absl::Status> statuses(world);
  std::vector<v1::CommandResult> results(world);
  std::mutex mu;
  std::condition_variable all_done;
  size_t pending = world;
  std::vector<char> answered(world, 0);
  int first_failed = -1;
  bool aborting = false;
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + limits_.timeout;
  std::optional<StallWatch> watch;
  if (limits_.stall_timeout > absl::ZeroDuration()) watch.emplace(limits_.stall_timeout);
  // When the ranks still running are probed next: one interval after the
  // first answer (ranks finishing a step together never see a probe), then
  // every interval. (The answers read only the constant interval: the
  // waiter drops `watch` without `mu`.)
  const std::chrono::nanoseconds probe_every =
      absl::ToChronoNanoseconds(watch.has_value() ? watch->probe_interval() : absl::ZeroDuration());
  StallWatch::Clock::time_point next_probe = StallWatch::Clock::time_point::max();
  bool stall_failed = false;
  for (size_t r = 0; r < world; ++r) {
    workers_[r]->Execute(&batch, deadline, [&, r](absl::StatusOr<v1::CommandResult> result) {
      std::lock_guard<std::mutex> lock(mu);
      const bool ok = result.ok();
      answered[r] = 1;
      if (ok) {
        results[r] = *std::move(result);
      } else {
        statuses[r] = result.status();
        if (first_failed < 0) first_failed = static_cast<int>(r);
      }
      if (pending-- == world && probe_every.count() > 0) {
        next_probe = StallWatch::Clock::now() + probe_every;
      }
      // Wake the waiter for the last answer or a failure (which it acts on
      // at once), not for every answer: a context switch per worker was a
      // tenth of a step's control cost at 8 workers.
      if (pending == 0 || !ok) all_done.notify_all();
    });
  }
  // Answers that come meanwhile are counted as ever; a failure among them
  // is acted on once it returns.
  if (while_running) while_running(batch);
  {
    std::unique_lock<std::mutex> lock(mu);
    while (pending > 0) {
      bool failed = false;
      for (const absl::Status& s : statuses) failed |= !s.ok();
      if (failed && !aborting && failure().ok()) {
        // Survivors are likely blocked in a collective with the failed rank:
        // abort them now rather than after their collective timeout.
        aborting = true;
        lock.unlock();
        AbortAll("another rank failed");
        lock.lock();
        continue;
      }
      if (!watch.has_value() || failed) {
        all_done.wait(lock);
        continue;
      }
      // Stalls are watched: the waiter wakes by itself every interval, to
      // see whether the probe is due.
      const StallWatch::Clock::time_point now = StallWatch::Clock::now();
      if (now < next_probe) {
        all_done.wait_until(lock, std::min(next_probe, now + probe_every));
        continue;
      }
      std::vector<int> running;  // ascending
      for (size_t r = 0; r < world; ++r) {
        if (answered[r] == 0) running.push_back(static_cast<int>(r));
      }
      lock.unlock();
      std::optional<StallWatch::Stall> stall;
      // A failure on its way (a missed heartbeat's) is the cause, not a stall.
      if (failure().ok()) stall = ProbeStragglers(running, *watch);
      lock.lock();
      next_probe = StallWatch::Clock::now() + probe_every;
      // One that answered while it was probed is not stalled after all.
      if (!stall.has_value() || answered[static_cast<size_t>(stall->rank)] != 0) continue;
      const absl::Status reason =
          StallFailure(batch, *stall, world - running.size(), watch->timeout());
      stall_failed = true;
      watch.reset();
      lock.unlock();
      spdlog::error("epoch {}: rank {}: {}", epoch_, stall->rank, std::string(reason.message()));
      // Cancels every call: their answers end the loop.
      Fail(stall->rank, reason);
      lock.lock();
    }
  }
  // Failed for a stall, the batch fails even if the rank's answer slipped in
  // between the check above and the cancel: the epoch is failed and aborted.
  if (stall_failed) return failure();
  if (absl::Status s = Settle(statuses, first_failed); !s.ok()) return s;
  if (on_batch_) on_batch_(batch, absl::Now() - start);
  std::lock_guard<std::mutex> lock(mu_);
  last_seq_ = batch.seq();
  return results;
}

absl::Status CommandSequencer::Summon(v1::CommandBatch batch, const WorkerClient::ChunkSink& sink) {
  if (absl::Status s = Begin(batch); !s.ok()) return s;
  const size_t world = workers_.size();
  std::vector<absl::Status> statuses(world);
  const absl::Time deadline = absl::Now() + limits_.timeout;
  std::mutex mu;
  std::condition_variable joined;
  size_t joining = world - 1;  // guarded by mu
  int first_failed = -1;       // guarded by mu
  const auto note = [&](size_t r, absl::Status status) {
    std::lock_guard<std::mutex> lock(mu);
    if (!status.ok() && first_failed < 0) first_failed = static_cast<int>(r);
    statuses[r] = std::move(status);
  };
  // Every other rank takes part in the gathers and streams nothing: its
  // call goes out asynchronously, all at once, with no thread of its own
  // (16,384 threads for one summon at that scale, before 2026-12-01).
  for (size_t r = 1; r < world; ++r) {
    workers_[r]->JoinSummonAsync(&batch, deadline, [&, r](absl::Status status) {
      note(r, std::move(status));
      std::lock_guard<std::mutex> lock(mu);
      if (--joining == 0) joined.notify_all();
    });
  }
  // A sink error (the client went away) is not the workers' failure: rank 0
  // finishes the collective without streaming and the job stays usable.
  absl::Status sink_status;
  absl::Status mine = workers_[0]->Summon(batch, deadline, [&](const v1::TensorChunk& chunk) {
    sink_status = sink(chunk);
    return sink_status;
  });
  note(0, sink_status.ok() ? std::move(mine) : absl::OkStatus());
  {
    // Each call ends by its deadline at the latest.
    std::unique_lock<std::mutex> lock(mu);
    joined.wait(lock, [&] { return joining == 0; });
  }
  if (absl::Status s = Settle(statuses, first_failed); !s.ok()) return s;
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_seq_ = batch.seq();
  }
  return sink_status;
}

}  // namespace flatshard
