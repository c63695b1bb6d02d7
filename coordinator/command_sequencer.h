// Fans each command batch of one job epoch out to every rank at once and
// gathers the results (docs/architecture.md §4). It stamps the epoch, the next seq and
// the digest, so workers can refuse anything out of order. When a rank fails
// the sequencer aborts the others (their collectives would otherwise wait for
// the failed rank), names the rank that caused it, and refuses every later
// batch: the job must be re-formed under a new epoch.
#ifndef FLATSHARD_COORDINATOR_COMMAND_SEQUENCER_H_
#define FLATSHARD_COORDINATOR_COMMAND_SEQUENCER_H_

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

#include "coordinator/stall_watch.h"
#include "coordinator/worker_client.h"
#include "flatshard/v1/worker.pb.h"

namespace flatshard {

// How long a batch may take.
struct BatchLimits {
  // End to end, on every rank.
  absl::Duration timeout = absl::Minutes(10);
  // Once some rank has finished the batch, a rank still running it whose
  // progress counter stays still this long is failed as stalled
  // (stall_watch.h). Zero: never; such a rank is then failed only at
  // `timeout`.
  absl::Duration stall_timeout = absl::Minutes(5);
};

class CommandSequencer {
 public:
  // Told of every batch that succeeded on all ranks and its round trip.
  using BatchObserver = std::function<void(const v1::CommandBatch&, absl::Duration)>;

  // `workers[r]` is rank r, kept alive as long as the sequencer: whoever
  // holds it (an operation, a heartbeat failing a rank, an async save's
  // committer) may use it while a recovery replaces the job's clients.
  CommandSequencer(std::vector<std::shared_ptr<WorkerClient>> workers, uint64_t epoch,
                   BatchLimits limits, BatchObserver on_batch = {});

  // Runs `batch` (its kind and content set by the caller; epoch, seq and,
  // unless it carries one (MakeStepBatch's), digest stamped here) on every
  // rank; the results by rank. Errors name the
  // rank to blame (the one that no longer answers, else the one that failed
  // first) in the message, and as FailedRank() unless the failure was a
  // timeout, a cancellation or an abort. A rank that stalls (BatchLimits)
  // fails the batch as DEADLINE_EXCEEDED, blamed on it. A batch without a
  // kind, or without a digest and with malformed content, is
  // INVALID_ARGUMENT before anything is sent.
  //
  // `while_running`, when set, is called with the batch as sent, on this
  // thread, once its calls to every rank are out and before the answers
  // are waited for: work for after this batch (the next step's journal
  // record) done in the time the ranks take anyway.
  using WhileRunning = std::function<void(const v1::CommandBatch& sent)>;
  absl::StatusOr<std::vector<v1::CommandResult>> Run(v1::CommandBatch batch,
                                                     const WhileRunning& while_running = {});

  // A summon batch: rank 0's chunks go to `sink`; the other ranks join the
  // collective and stream nothing.
  absl::Status Summon(v1::CommandBatch batch, const WorkerClient::ChunkSink& sink);

  // Fails the batch in flight (cancels its calls) and every later one with
  // `reason`, e.g. a rank missed its heartbeats (`rank` -1: no rank is to
  // blame, the job was stopped). Thread-safe.
  void Fail(int rank, const absl::Status& reason);

  // Before the first batch: a re-adopted epoch goes on after `last_seq`, the
  // seq every rank reported as its last completed one.
  void ResumeAfter(uint64_t last_seq);
  // Told of every batch, stamped, just before it is sent: the state store's
  // write-ahead record, by which a restarted coordinator tells whether it ran.
  using BatchJournal = std::function<void(const v1::CommandBatch&)>;
  void set_journal(BatchJournal journal);

  uint64_t epoch() const { return epoch_; }
  uint64_t last_seq() const;
  absl::Status failure() const;

 private:
  absl::Status Begin(v1::CommandBatch& batch);
  // Picks the rank to blame among per-rank failures and aborts the
  // survivors. `first_failed` is the rank whose failure arrived first (-1:
  // none did): the others' may be that failure's echo (their collective lost
  // it, or the sequencer aborted them).
  absl::Status Settle(const std::vector<absl::Status>& statuses, int first_failed);
  void AbortAll(const std::string& reason);
  // Asks each rank in `running` (ascending; the others answered) for its
  // progress and tells `watch`; the rank it then finds stalled, if any.
  std::optional<StallWatch::Stall> ProbeStragglers(const std::vector<int>& running,
                                                   StallWatch& watch);
  // The failure of `batch` for `stall`, once `finished` ranks had answered.
  absl::Status StallFailure(const v1::CommandBatch& batch, const StallWatch::Stall& stall,
                            size_t finished, absl::Duration timeout) const;

  std::vector<std::shared_ptr<WorkerClient>> workers_;
  std::vector<WorkerClient*> clients_;  // workers_'s, for the fan-outs
  const uint64_t epoch_;
  const BatchLimits limits_;
  const BatchObserver on_batch_;
  mutable std::mutex mu_;
  std::condition_variable aborted_;
  bool aborting_ = false;  // Fail() is aborting the ranks
  uint64_t last_seq_ = 0;
  absl::Status failure_;
  BatchJournal journal_;
};

}  // namespace flatshard

#endif  // FLATSHARD_COORDINATOR_COMMAND_SEQUENCER_H_
