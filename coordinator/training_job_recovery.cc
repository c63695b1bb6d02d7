// TrainingJob's automatic recovery from a failed rank (docs/fault-tolerance.md):
// the failed epoch is cancelled everywhere, the members that still answer are
// kept, spares fill the failed seats (or the job shrinks, within its recovery
// policy), a new epoch is configured, and the newest checkpoint of the job's
// history the new world can load is restored (checkpoint_history.h).
// Everything here runs with the operation slot held, so no client operation
// sees a half-recovered job.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "coordinator/checkpoint_history.h"
#include "coordinator/recovery_plan.h"
#include "coordinator/training_job.h"
#include "core/status_macros.h"
#include "core/status_payloads.h"

namespace flatshard {

bool TrainingJob::FailRank(int rank, const std::string& worker_id, const absl::Status& reason,
                           const std::string& incarnation) {
  // The state being recorded, if a transition is: a recovery that has
  // decided READY (and writes it) will not try again, so a failure now is a
  // READY job's, recovered as one.
  const v1::JobState state = states_.ForRecord().state;
  // A recovery's (or growth's) epoch stays FORMING until it has restored.
  const bool recovering = state == v1::RECOVERING || state == v1::FORMING;
  if (!recovering && state != v1::READY && state != v1::TRAINING && state != v1::IDLE) {
    return false;
  }
  std::shared_ptr<CommandSequencer> seq;
  bool recovery_runs = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The caller found the rank in the epoch it read; a recovery since may
    // have seated someone else there, whose epoch this must not fail.
    const auto r = static_cast<size_t>(rank);
    if (rank < 0 || r >= worker_ids_.size() || worker_ids_[r] != worker_id) return false;
    if (!incarnation.empty() && (r >= members_.size() || members_[r].incarnation != incarnation)) {
      return false;
    }
    seq = sequencer_;
    recovery_runs = recovering_;
  }
  if (recovering) {
    // The recovery's own batches (the restore in the epoch it formed) fail
    // now, and it tries again; before it formed one, the failed epoch's
    // sequencer has already failed and there is nothing to do. Re-adoption
    // (RECOVERING, no recovery running) settles its epoch by itself.
    if (!recovery_runs || seq == nullptr || !seq->failure().ok()) return false;
    seq->Fail(rank, reason);
    return true;
  }
  // An operation blocked on the failed rank returns now and recovers itself.
  if (seq != nullptr) seq->Fail(rank, reason);
  const absl::Status cause(reason.code(), absl::StrCat("rank ", rank, ": ", reason.message()));
  // With no operation running, a thread takes the slot and recovers; when an
  // operation did run, it recovered first and the epoch moved on. Each
  // failure is recovered only while its epoch is current.
  std::thread finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return true;
    if (recovery_pending_) {
      // The pending recoverer may already have checked (or be recovering)
      // an older epoch; it takes this one up after.
      next_failure_ = SeenFailure{cause, epoch_};
      return true;
    }
    recovery_pending_ = true;
    finished = std::move(recoverer_);
    recoverer_ = std::thread([this, failure = SeenFailure{cause, epoch_}]() mutable {
      for (;;) {
        {
          OperationLock op(op_mu_);
          bool current = false;
          {
            std::lock_guard<std::mutex> inner(mu_);
            NoteOperationLocked("recover");
            current = !stopping_ && epoch_ == failure.epoch;
          }
          if (current) (void)OnBatchFailure(failure.cause);
        }
        std::lock_guard<std::mutex> inner(mu_);
        if (stopping_ || !next_failure_.has_value()) {
          next_failure_.reset();
          recovery_pending_ = false;
          return;
        }
        failure = *std::move(next_failure_);
        next_failure_.reset();
      }
    });
  }
  if (finished.joinable()) finished.join();  // it had cleared recovery_pending_: done
  return true;
}

absl::Status TrainingJob::OnBatchFailure(const absl::Status& cause) {
  int restarts = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // A failure while recovering (the restore's own batches) is RecoverLocked's
    // to report; a stopping job does not recover.
    if (recovering_ || stopping_) return cause;
    restarts = restarts_;
  }
  const v1::JobState state = states_.state();
  if (state == v1::FAILED || state == v1::STOPPED) return cause;
  const int max = config_.recovery.max_restarts;
  if (restarts >= max) {
    absl::Status final_status(
        cause.code(),
        absl::StrCat(cause.message(),
                     max == 0 ? std::string(" (recovery.max_restarts is 0: no automatic recovery)")
                              : absl::StrCat(" (no automatic recovery left: recovery.max_restarts ",
                                             max, " used)")));
    FailWith(final_status);
    return final_status;
  }
  return RecoverLocked(cause, {});
}

std::optional<v1::CheckpointInfo> TrainingJob::RecoveryCheckpoint(int world_size) const {
  absl::StatusOr<std::vector<v1::CheckpointInfo>> committed = catalog_.List();
  if (!committed.ok()) return std::nullopt;
  return RecoveryCheckpointOf(*committed, world_size);
}

std::optional<v1::CheckpointInfo> TrainingJob::RecoveryCheckpointOf(
    const std::vector<v1::CheckpointInfo>& committed, int world_size) const {
  CheckpointHistory history;
  {
    std::lock_guard<std::mutex> lock(mu_);
    history = history_;
  }
  return ChooseRecoveryCheckpoint(committed, world_size, history);
}

absl::StatusOr<std::vector<v1::CheckpointInfo>> TrainingJob::ListCheckpoints() const {
  ASSIGN_OR_RETURN(std::vector<v1::CheckpointInfo> committed, catalog_.List());
  const std::optional<v1::CheckpointInfo> target = RecoveryCheckpointOf(committed, world_size());
  for (v1::CheckpointInfo& c : committed) {
    c.set_recovery_target(target.has_value() && c.name() == target->name());
  }
  return committed;
}

absl::Status TrainingJob::RecoverLocked(const absl::Status& cause, std::vector<int> failed_ranks) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    recovering_ = true;
  }
  struct ClearRecovering {
    TrainingJob* job;
    ~ClearRecovering() {
      std::lock_guard<std::mutex> lock(job->mu_);
      job->recovering_ = false;
    }
  } clear{this};
  // A second failure while recovering (a worker that dies during the
  // re-formation or the restore) is recovered from again, each try counting
  // as a restart; too few workers, or no restart left, fail the job.
  absl::Status why = cause;
  // A spare whose Configure or restore failed in a try (a node without the
  // data set or the checkpoint storage, say) is refused (refused_joiners_):
  // the next try takes another or shrinks.
  // Tries that failed on a link LinkFailures forgave: bounded anyway (each
  // leaves its two ends one failure from blame), and here once more.
  constexpr int kMaxFreeRetries = 2;
  int free_retries = 0;
  while (true) {
    Retry retry = Retry::kNo;
    absl::Status attempt = RecoverOnce(why, failed_ranks, &retry);
    if (attempt.ok()) return attempt;
    int restarts = 0;
    bool stopping = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (retry == Retry::kFree && free_retries < kMaxFreeRetries) {
        ++free_retries;
        --restarts_;  // the try is not one of recovery.max_restarts
        // The next try repeats this restart's number: its cause says why.
        attempt = absl::Status(attempt.code(), absl::StrCat(attempt.message(),
                                                            " (a failed link, forgiven once: "
                                                            "not counted)"));
      }
      restarts = restarts_;
      stopping = stopping_;
    }
    // Only a stop ends it here: a try's CANCELLED (a call cut short on a
    // worker) is that try's failure, and giving up on it would leave the job
    // RECOVERING with nothing recovering it.
    if (stopping) return attempt;
    const int max = config_.recovery.max_restarts;
    const bool retryable = retry != Retry::kNo;
    if (!retryable || restarts >= max) {
      absl::Status final_status =
          retryable ? absl::Status(attempt.code(), absl::StrCat(attempt.message(),
                                                                " (no automatic recovery left: "
                                                                "recovery.max_restarts ",
                                                                max, " used)"))
                    : attempt;
      FailWith(final_status);
      return final_status;
    }
    spdlog::warn("job {}: {}; recovering again", config_.name, std::string(attempt.message()));
    why = attempt;
    failed_ranks.clear();
  }
}

absl::Status TrainingJob::RecoverOnce(const absl::Status& cause, std::vector<int> failed_ranks,
                                      Retry* retry) {
  const absl::Time began = absl::Now();
  int64_t failed_step = 0;
  int restart = 0;
  std::vector<std::string> epoch_ids;  // the failed epoch's, by rank
  {
    std::lock_guard<std::mutex> lock(mu_);
    failed_step = step_;
    restart = ++restarts_;
    epoch_ids = worker_ids_;
  }
  const std::set<std::string> old_ids(epoch_ids.begin(), epoch_ids.end());
  const auto rank_of = [&epoch_ids](const std::string& id) -> std::optional<int> {
    const auto at = std::find(epoch_ids.begin(), epoch_ids.end(), id);
    if (at == epoch_ids.end()) return std::nullopt;
    return static_cast<int>(at - epoch_ids.begin());
  };
  const auto fail = [&](const absl::Status& why, Retry what_follows) {
    *retry = what_follows;
    return absl::Status(why.code(),
                        absl::StrCat(cause.message(), "; recovery failed: ", why.message()));
  };
  RETURN_IF_ERROR(states_.Transition(
      v1::RECOVERING, absl::StrCat(cause.message(), "; recovering (restart ", restart, " of ",
                                   config_.recovery.max_restarts, ")")));
  // Nothing of the failed epoch may go on: batches in flight end, waits wake.
  if (const std::shared_ptr<CommandSequencer> seq = sequencer(); seq != nullptr) {
    seq->Fail(-1, cause);
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& client : clients_) client->CancelAll();
  }
  RecoveryCandidates candidates;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const WorkerRecord& m : members_) {
      if (!m.device.empty()) {
        candidates.device = m.device;
        break;
      }
    }
  }
  std::map<std::string, std::vector<v1::PeerSnapshotHeld>> held;  // by worker id
  std::vector<int> unreachable = ProbeMembers(&candidates.survivors, &held);
  failed_ranks.insert(failed_ranks.end(), unreachable.begin(), unreachable.end());
  std::map<int, WorkerRecord> lost;  // by rank: they may come back (the spare wait)
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (int r : unreachable) {
      if (static_cast<size_t>(r) < members_.size()) lost[r] = members_[static_cast<size_t>(r)];
    }
  }
  // A member that broke the failed epoch's restore as a newcomer (the spare
  // of an earlier try, a worker grown back onto) does not survive it.
  std::erase_if(candidates.survivors, [&](const WorkerRecord& w) {
    if (!RefusedToJoin(w)) return false;
    if (const std::optional<int> rank = rank_of(w.worker_id)) failed_ranks.push_back(*rank);
    return true;
  });
  std::sort(failed_ranks.begin(), failed_ranks.end());
  failed_ranks.erase(std::unique(failed_ranks.begin(), failed_ranks.end()), failed_ranks.end());

  // Spares: live workers that were not in the failed epoch, waited for a
  // bounded time rather than shrinking at once (a restarted daemon registers
  // within seconds), and longer while too few are live to re-form at all.
  std::set<std::string> readmitted;  // members lost to the probe, back
  RETURN_IF_ERROR(AwaitSeats(began, old_ids, &lost, &candidates, &held, &readmitted));
  // A survivor that left during the wait lost the epoch too, whether it
  // stayed away or was readmitted (its daemon restarted: the epoch's state
  // in it is gone all the same).
  for (const auto& entry : lost) failed_ranks.push_back(entry.first);
  for (const std::string& id : readmitted) {
    if (const std::optional<int> rank = rank_of(id)) failed_ranks.push_back(*rank);
  }
  std::sort(failed_ranks.begin(), failed_ranks.end());
  failed_ranks.erase(std::unique(failed_ranks.begin(), failed_ranks.end()), failed_ranks.end());
  v1::JobSpec spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    spec = spec_;
  }
  absl::StatusOr<RecoveryChoice> choice = ChooseRecovery(spec, config_.recovery, candidates);
  if (!choice.ok()) {
    const std::string waited = absl::StrCat(
        "after ", absl::FormatDuration(absl::Trunc(absl::Now() - began, absl::Milliseconds(100))),
        " of waiting for workers (recovery.spare_wait_s ", config_.recovery.spare_wait_s,
        ", recovery.min_world_wait_s ", config_.recovery.min_world_wait_s, "): ");
    return fail(
        absl::Status(choice.status().code(), absl::StrCat(waited, choice.status().message())),
        Retry::kNo);
  }
  const int world = choice->config.world_size;
  std::vector<std::string> blamed;
  // A spare that fails the new epoch's Configure or restore (its node lacks
  // the data set or cannot read the shared checkpoint storage, say) would
  // fail every try it is chosen for, and every grow-back after: refused. So
  // is a member readmitted after the probe lost it (a daemon restarted on
  // such a node). A connection between two ranks that failed is blamed on
  // neither at first: a spare is refused for its second (LinkFailures).
  const auto refuse_spare = [&](const std::string& worker_id, const absl::Status& why) {
    if (worker_id.empty()) return;
    if (old_ids.contains(worker_id) && !readmitted.contains(worker_id)) return;
    for (const WorkerRecord& w : choice->members) {
      if (w.worker_id == worker_id) RefuseJoiner(w, why.message());
    }
  };
  if (absl::Status formed = FormLocked(choice->members, choice->spec,
                                       std::make_shared<const JobConfig>(choice->config), &blamed);
      !formed.ok()) {
    for (const std::string& worker_id : blamed) refuse_spare(worker_id, formed);
    // FormLocked named the rank. A link it blamed no one for is retried free.
    const bool forgiven = blamed.empty() && UnreachablePeer(formed).has_value();
    return fail(formed, forgiven ? Retry::kFree : Retry::kCounted);
  }
  const auto fail_batch = [&](const absl::Status& why) {
    refuse_spare(BlamedMember(why), why);
    return fail(why, Retry::kCounted);
  };
  std::optional<std::string> checkpoint;
  const std::optional<v1::CheckpointInfo> newest = RecoveryCheckpoint(world);
  // The survivors' in-memory peer snapshots, when they hold a newer step than
  // that checkpoint; the checkpoint otherwise, or when they fail.
  bool from_memory = false;
  std::optional<PeerSnapshotChoice> snapshot;
  {
    std::vector<std::string> ids;
    for (const WorkerRecord& m : choice->members) ids.push_back(m.worker_id);
    PeerSnapshotMarks marks;
    {
      std::lock_guard<std::mutex> lock(mu_);
      marks = peer_marks_;
    }
    snapshot = ChoosePeerSnapshot(config_.name, ids, held, marks,
                                  newest.has_value() ? newest->step() : -1);
  }
  if (snapshot.has_value()) {
    absl::StatusOr<bool> restored = RestorePeerSnapshotLocked(*snapshot);
    if (!restored.ok()) return fail_batch(restored.status());
    from_memory = *restored;
  }
  if (from_memory) {
    // Restored: nothing to load.
  } else if (newest.has_value()) {
    checkpoint = newest->name();
    absl::StatusOr<v1::CheckpointInfo> loaded = LoadLocked(*checkpoint, /*starts_history=*/false);
    if (!loaded.ok()) return fail_batch(loaded.status());
  } else {
    // No checkpoint: the new epoch starts from the seed's initialization.
    std::lock_guard<std::mutex> lock(mu_);
    step_ = 0;
    data_position_ = 0;
  }
  v1::Recovery record;
  record.set_cause(std::string(cause.message()));
  for (int r : failed_ranks) record.add_failed_ranks(r);
  {
    std::lock_guard<std::mutex> lock(mu_);
    record.set_resumed_step(step_);
    record.set_epoch(epoch_);
  }
  record.set_failed_at_step(failed_step);
  record.set_steps_lost(failed_step - record.resumed_step());
  record.set_world_size(world);
  record.set_checkpoint(checkpoint.value_or(""));
  record.set_from_peer_snapshot(from_memory);
  record.set_spare_used(choice->spare_used);
  record.set_seconds(absl::ToDoubleSeconds(absl::Now() - began));
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_recovery_ = record;
  }
  const std::string summary = absl::StrCat(
      "recovered in ",
      absl::FormatDuration(absl::Trunc(absl::Now() - began, absl::Milliseconds(1))), ": ",
      failed_ranks.empty() ? std::string("no rank lost")
                           : absl::StrCat("rank(s) ", absl::StrJoin(failed_ranks, ","), " failed"),
      "; epoch ", record.epoch(), " at world size ", world,
      world == config_.world_size
          ? std::string(choice->spare_used ? " with a spare" : "")
          : absl::StrCat(" (shrunk from ", config_.world_size, ": too few live workers)"),
      "; resumed at step ", record.resumed_step(),
      from_memory ? absl::StrCat(" from in-memory peer snapshots (", snapshot->copies_used,
                                 " rank(s) from a neighbour's copy)")
      : checkpoint.has_value() ? absl::StrCat(" from checkpoint ", *checkpoint)
                               : std::string(" from initialization (no checkpoint)"),
      ", ", record.steps_lost(), " step(s) lost");
  spdlog::warn("job {}: {}", config_.name, summary);
  if (options_.observer != nullptr) options_.observer->OnRecovery(config_.name, record);
  return states_.Transition(v1::READY, summary);
}

std::string TrainingJob::BlamedMember(const absl::Status& failure) const {
  const std::optional<int> rank = FailedRank(failure);
  std::lock_guard<std::mutex> lock(mu_);
  if (!rank.has_value() || static_cast<size_t>(*rank) >= members_.size()) return "";
  return members_[static_cast<size_t>(*rank)].worker_id;
}

}  // namespace flatshard
