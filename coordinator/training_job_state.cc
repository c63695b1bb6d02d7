// TrainingJob across coordinator restarts (docs/fault-tolerance.md,
// "Coordinator restart"): what the job writes to the state store, how a
// restarted coordinator builds it again, and how it takes its workers back.
//
// The batch journal is a write-ahead record: every batch is written, stamped
// with its epoch and seq and with the progress it leads to, before it is sent.
// Progress is written after every batch. So when the coordinator dies at any
// moment, its store holds either the state before the last batch (and the
// batch), or the state after it; the ranks' reports say which one is true:
// all at the batch's seq (it ran everywhere), all at the seq before it (it
// ran nowhere), or anything else (it ran on some ranks: roll back).
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"

#include "coordinator/readoption.h"
#include "coordinator/training_job.h"
#include "coordinator/worker_fan_out.h"
#include "core/status_macros.h"

namespace flatshard {
namespace {

// How long re-adoption waits for batches still running on the ranks.
constexpr absl::Duration kReadoptSettleTime = absl::Seconds(15);
// How long a rank that does not answer is asked again: the restarted
// coordinator's channels are new, and a first connection can fail under load.
constexpr absl::Duration kReadoptAnswerTime = absl::Seconds(2);

// The same journal row: the same batch (its epoch, seq and digest, which
// covers its content) leading to the same place.
bool SameRecord(const BatchRecord& a, const BatchRecord& b) {
  return a.batch.job_epoch() == b.batch.job_epoch() && a.batch.seq() == b.batch.seq() &&
         a.batch.kind_case() == b.batch.kind_case() && a.batch.digest() == b.batch.digest() &&
         a.step_after == b.step_after && a.data_position_after == b.data_position_after &&
         a.mid_step_before == b.mid_step_before;
}

}  // namespace

void TrainingJob::WatchState() {
  states_.set_on_transition([this] { Persist(); });
  catalog_.set_on_change([this](const std::vector<v1::CheckpointInfo>& all) {
    std::lock_guard<std::mutex> lock(persist_mu_);
    if (state_store_ == nullptr) return;
    if (absl::Status s = state_store_->PutCheckpoints(config_.name, all); !s.ok()) {
      spdlog::error("job {}: {}", config_.name, std::string(s.message()));
    }
  });
}

void TrainingJob::DetachState() {
  std::lock_guard<std::mutex> lock(persist_mu_);
  state_store_ = nullptr;
}

void TrainingJob::Persist() {
  std::lock_guard<std::mutex> persist(persist_mu_);
  if (state_store_ == nullptr) return;
  JobRecord record;
  // Read under persist_mu_: of two writers, the second sees the newer state
  // (a transition's, while it is being recorded).
  const JobStateMachine::Recorded recorded = states_.ForRecord();
  record.state = recorded.state;
  record.failure = recorded.failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    record.spec = spec_;
    record.epoch = epoch_;
    record.step = step_;
    record.data_position = data_position_;
    record.last_seq = sequencer_ != nullptr ? sequencer_->last_seq() : 0;
    record.restarts = restarts_;
    record.world_size = epoch_config_->world_size;
    record.worker_ids = worker_ids_;
    record.last_recovery = last_recovery_;
    record.state_checkpoint = state_checkpoint_;
    record.history = history_;
  }
  const absl::Status put = state_store_->PutJob(record);
  if (!put.ok()) {
    // Training goes on without durability; a restart then rolls back.
    spdlog::error("job {}: {}", config_.name, std::string(put.message()));
  }
  // Only a write that succeeded says the store holds no name: a failed one
  // may still have landed.
  stored_state_checkpoint_ =
      !record.state_checkpoint.empty() || (!put.ok() && stored_state_checkpoint_);
}

void TrainingJob::PersistProgress() {
  std::lock_guard<std::mutex> persist(persist_mu_);
  if (state_store_ == nullptr) return;
  // A restart takes the step from the journaled last batch (step_after), not
  // from here (ReadoptLocked), and every state transition writes the whole
  // record: this is for readers of the state dir while training runs, so once
  // a second is enough, and the step's second SQLite commit goes away
  // (control_plane_bench: 1.25x a bare fan-out with a commit per step).
  const absl::Time now = absl::Now();
  if (now - last_progress_persisted_ < absl::Seconds(1)) return;
  last_progress_persisted_ = now;
  int64_t step = 0;
  int64_t data_position = 0;
  uint64_t last_seq = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    step = step_;
    data_position = data_position_;
    last_seq = sequencer_ != nullptr ? sequencer_->last_seq() : 0;
  }
  if (absl::Status s = state_store_->PutProgress(config_.name, step, data_position, last_seq);
      !s.ok()) {
    spdlog::error("job {}: {}", config_.name, std::string(s.message()));
  }
}

void TrainingJob::JournalBatch(const v1::CommandBatch& batch) {
  // Before the batch is sent, journal or not: from here the ranks' state
  // may be no checkpoint's.
  const bool changes_state =
      batch.has_step() ||
      (batch.has_checkpoint() &&
       (batch.checkpoint().load_shard().apply() || batch.checkpoint().has_restore_peer_snapshot()));
  // persist_mu_ first, as a save's commit takes it: a commit that names the
  // state cannot write its name after this batch cleared it.
  std::lock_guard<std::mutex> persist(persist_mu_);
  BatchRecord record;
  record.batch = batch;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (changes_state) {
      ++state_generation_;
      state_checkpoint_.clear();
    }
    if (state_store_ == nullptr) return;
    const bool step = batch.has_step();
    record.step_after = step_ + (step && batch.step().sync_gradients() ? 1 : 0);
    record.data_position_after = data_position_ + (step ? 1 : 0);
    // The sequencer sends a batch only once the one before it ran on every
    // rank; a failed one ends the epoch. So within an epoch, the ranks hold a
    // step's micro-batch gradients exactly when the last batch was one.
    record.mid_step_before = journaled_micro_epoch_ == batch.job_epoch();
    journaled_mid_step_before_ = record.mid_step_before;
    journaled_micro_epoch_ = step && !batch.step().sync_gradients() ? batch.job_epoch() : 0;
  }
  // Only while the store may name a checkpoint: a step's commit stays one
  // row's write.
  const bool clears = changes_state && stored_state_checkpoint_;
  // Written already, while the batch before it ran (JournalAhead).
  const std::optional<BatchRecord> ahead = std::exchange(journaled_ahead_, std::nullopt);
  if (!clears && ahead.has_value() && SameRecord(*ahead, record)) return;
  if (absl::Status s = state_store_->PutLastBatch(config_.name, record, clears); !s.ok()) {
    spdlog::error("job {}: {}", config_.name, std::string(s.message()));
  } else if (clears) {
    stored_state_checkpoint_ = false;
  }
}

void TrainingJob::JournalAhead(const v1::CommandBatch& sent, v1::CommandBatch next) {
  if (!sent.has_step() || !next.has_step()) return;
  next.set_job_epoch(sent.job_epoch());
  next.set_seq(sent.seq() + 1);
  std::lock_guard<std::mutex> persist(persist_mu_);
  BatchRecord record;
  {
    // `sent` has not moved step_ and data_position_ yet: JournalBatch's
    // record of `next`, counted from the state `sent` leaves.
    std::lock_guard<std::mutex> lock(mu_);
    if (state_store_ == nullptr) return;
    const int sent_sync = sent.step().sync_gradients() ? 1 : 0;
    record.step_after = step_ + sent_sync + (next.step().sync_gradients() ? 1 : 0);
    record.data_position_after = data_position_ + 2;
    record.mid_step_before = sent_sync == 0;
    // JournalBatch's of `sent`, which it ran just before.
    record.previous_mid_step_before = journaled_mid_step_before_;
  }
  record.written_ahead = true;
  record.batch = std::move(next);
  journaled_ahead_.reset();
  if (absl::Status s =
          state_store_->PutLastBatch(config_.name, record, /*clears_state_checkpoint=*/false);
      !s.ok()) {
    spdlog::error("job {}: {}", config_.name, std::string(s.message()));
    return;
  }
  journaled_ahead_ = std::move(record);
}

void TrainingJob::NameTheState(const std::string& checkpoint, uint64_t generation) {
  // persist_mu_ first, as JournalBatch takes it: see there.
  std::lock_guard<std::mutex> persist(persist_mu_);
  {
    // Still the state it holds, unless something changed it since the
    // snapshot (an async save's training went on, a load, a recovery).
    std::lock_guard<std::mutex> lock(mu_);
    if (state_generation_ != generation) return;
    state_checkpoint_ = checkpoint;
  }
  if (state_store_ == nullptr) return;
  stored_state_checkpoint_ = true;  // a failed write may still have landed
  if (absl::Status s = state_store_->PutStateCheckpoint(config_.name, checkpoint); !s.ok()) {
    spdlog::error("job {}: {}", config_.name, std::string(s.message()));
  }
}

absl::StatusOr<std::unique_ptr<TrainingJob>> TrainingJob::Restore(
    const JobRecord& record, const std::optional<BatchRecord>& last_batch,
    const std::optional<v1::TrainingOperation>& training, TrainingJobOptions options) {
  ASSIGN_OR_RETURN(JobConfig config, JobConfigFromProto(record.spec));
  // Attached at the end: the store keeps the record as it is until the job
  // changes state for real (a second restart must find the same record).
  StateStore* store = options.state;
  options.state = nullptr;
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingJob> job,
                   Build(record.spec, std::move(config), std::move(options)));
  const int world = record.world_size > 0 ? record.world_size : job->config_.world_size;
  std::shared_ptr<const JobConfig> epoch_config;
  if (world == job->config_.world_size) {
    epoch_config = std::make_shared<const JobConfig>(job->config_);
  } else {
    // A recovery had shrunk the job: its epoch ran at the smaller world size.
    v1::JobSpec epoch_spec = record.spec;
    epoch_spec.set_world_size(world);
    epoch_spec.clear_rank_by_worker_id();
    ASSIGN_OR_RETURN(JobConfig shrunk, JobConfigFromProto(epoch_spec));
    epoch_config = std::make_shared<const JobConfig>(std::move(shrunk));
  }
  // Progress is persisted at most once a second; a journaled step batch of
  // the epoch is newer: the job had reached at least the step it began in
  // (what a rollback counts its lost steps from).
  int64_t step = record.step;
  if (last_batch.has_value() && last_batch->batch.job_epoch() == record.epoch &&
      last_batch->batch.has_step()) {
    const bool sync = last_batch->batch.step().sync_gradients();
    // A row written ahead (written_ahead) keeps its mark once its batch is
    // sent, so whether that batch began is not known here: counted as begun.
    // A rollback after one that never began counts one step more than lost.
    step = std::max(step, last_batch->step_after - (sync ? 1 : 0));
  }
  {
    std::lock_guard<std::mutex> lock(job->mu_);
    job->epoch_ = record.epoch;
    job->step_ = step;
    job->data_position_ = record.data_position;
    job->restarts_ = record.restarts;
    job->last_recovery_ = record.last_recovery;
    job->worker_ids_ = record.worker_ids;
    job->epoch_config_ = std::move(epoch_config);
    // Whatever the re-adoption finds: a batch that changed the state since
    // cleared it in the store before it was sent, and a failed re-adoption
    // clears it (ReadoptLocked).
    job->state_checkpoint_ = record.state_checkpoint;
    job->history_ = record.history;
    if (record.state != v1::FAILED) job->resume_ = training;
  }
  const std::string where = absl::StrCat("step ", step, ", epoch ", record.epoch, ", ",
                                         record.worker_ids.size(), " ranks");
  switch (record.state) {
    case v1::FAILED:
      job->states_.Restore(v1::FAILED, record.failure,
                           absl::StrCat("restored by a restarted coordinator (", where,
                                        "): FAILED: ", record.failure));
      break;
    case v1::PENDING:
    case v1::FORMING:
      if (record.epoch == 0) {
        job->states_.Restore(v1::PENDING, "",
                             "restored by a restarted coordinator: never formed, waiting for "
                             "workers");
        break;
      }
      [[fallthrough]];
    default: {
      Restored restored;
      restored.record = record;
      restored.last_batch = last_batch;
      // Mid-formation or mid-recovery the ranks are in no state to go on.
      restored.adoptable =
          record.state == v1::READY || record.state == v1::TRAINING || record.state == v1::IDLE;
      job->restored_ = std::move(restored);
      job->states_.Restore(
          v1::RECOVERING, "",
          absl::StrCat("the coordinator restarted with the job ", v1::JobState_Name(record.state),
                       " at ", where, "; waiting for its workers to report"));
      break;
    }
  }
  std::lock_guard<std::mutex> lock(job->persist_mu_);
  job->state_store_ = store;
  job->stored_state_checkpoint_ = !record.state_checkpoint.empty();
  return job;
}

std::vector<std::string> TrainingJob::readoption_pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restored_.has_value() ? restored_->record.worker_ids : std::vector<std::string>{};
}

absl::StatusOr<TrainingJob::Progress> TrainingJob::AgreedProgress(
    const std::vector<WorkerRecord>& members) {
  Restored restored;
  std::vector<WorkerClient*> clients;
  {
    std::lock_guard<std::mutex> lock(mu_);
    restored = *restored_;
    for (const auto& client : clients_) clients.push_back(client.get());
  }
  const JobRecord& record = restored.record;
  if (!restored.adoptable) {
    return absl::FailedPreconditionError(
        absl::StrCat("it was ", v1::JobState_Name(record.state), " when the coordinator stopped"));
  }
  std::vector<absl::StatusOr<v1::GetStatusResponse>> reports;
  // A batch the old coordinator sent may still be running on a rank; it ends
  // within a step, or the worker aborts it once it has lost its coordinator
  // (flatshard-worker --coordinator-timeout). Bounded: then it counts as is.
  const absl::Time settle_by = absl::Now() + kReadoptSettleTime;
  const absl::Time answer_by = absl::Now() + kReadoptAnswerTime;
  while (true) {
    // New channels, each connecting first (the answers keep them connected).
    reports =
        GetStatusAll(clients, absl::Now() + FanOutTimeout(options_.probe_timeout, clients.size(),
                                                          FanOutChannels::kConnecting));
    bool running = false, unanswered = false;
    for (const auto& report : reports) {
      running |= report.ok() && report->state() == "running";
      unanswered |= !report.ok();
    }
    const absl::Time now = absl::Now();
    if (now >= settle_by || (!running && (!unanswered || now >= answer_by))) break;
    absl::SleepFor(absl::Milliseconds(100));  // polls the ranks, bounded by settle_by
  }
  std::vector<std::string> seen;
  std::optional<uint64_t> agreed;
  bool disagree = false;
  for (size_t r = 0; r < reports.size(); ++r) {
    if (!reports[r].ok()) {
      return absl::UnavailableError(
          absl::StrCat("rank ", r, " (worker ", members[r].worker_id,
                       ") does not answer: ", reports[r].status().message()));
    }
    const v1::GetStatusResponse& report = *reports[r];
    seen.push_back(absl::StrCat("rank ", r, ": epoch ", report.job_epoch(), " seq ",
                                report.last_completed_seq(), " ", report.state()));
    const bool usable = report.job_epoch() == record.epoch &&
                        report.rank() == static_cast<int>(r) && report.state() == "ready";
    if (!usable) disagree = true;
    if (!agreed.has_value()) agreed = report.last_completed_seq();
    if (*agreed != report.last_completed_seq()) disagree = true;
  }
  const auto explain = [&](const std::string& why) {
    return absl::FailedPreconditionError(
        absl::StrCat(why, " (", absl::StrJoin(seen, "; "), "; the coordinator's last batch: ",
                     restored.last_batch.has_value()
                         ? absl::StrCat("epoch ", restored.last_batch->batch.job_epoch(), " seq ",
                                        restored.last_batch->batch.seq())
                         : std::string("none"),
                     ")"));
  };
  if (disagree || !agreed.has_value()) return explain("the ranks disagree");
  absl::StatusOr<ReadoptionPoint> point = ReadoptionPointAt(record, restored.last_batch, *agreed);
  if (!point.ok()) return explain(std::string(point.status().message()));
  return Progress{point->step, point->data_position, point->last_seq};
}

absl::Status TrainingJob::Readopt() {
  absl::Status status = ReadoptLocked();
  // The slot is free again: the restored training takes it.
  if (states_.state() == v1::READY) ResumeTraining();
  return status;
}

absl::Status TrainingJob::ReadoptLocked() {
  OperationLock op(op_mu_);
  const absl::Time began = absl::Now();
  Restored restored;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!restored_.has_value()) return absl::OkStatus();
    NoteOperationLocked("re-adopt the workers");
    restored = *restored_;
  }
  const JobRecord& record = restored.record;
  // The epoch's members as the restarted coordinator knows them (addresses
  // from its membership), and a client for each: recovery probes them too.
  std::vector<WorkerRecord> members;
  std::vector<std::shared_ptr<WorkerClient>> clients;
  for (const std::string& id : record.worker_ids) {
    std::optional<WorkerRecord> known;
    if (options_.find_worker) known = options_.find_worker(id);
    WorkerRecord member = known.value_or(WorkerRecord{});
    member.worker_id = id;
    members.push_back(member);
    clients.push_back(options_.connect(member, record.worker_ids.size()));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    clients_ = std::move(clients);
    members_ = members;
  }
  absl::StatusOr<Progress> progress = AgreedProgress(members);
  {
    std::lock_guard<std::mutex> lock(mu_);
    restored_.reset();
  }
  if (progress.ok()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      sequencer_ = MakeSequencerLocked(record.epoch);
      sequencer_->ResumeAfter(progress->last_seq);
      step_ = progress->step;
      data_position_ = progress->data_position;
      unsharded_.clear();
    }
    const std::string summary =
        absl::StrCat("re-adopted ", members.size(), " workers of epoch ", record.epoch,
                     " after a coordinator "
                     "restart in ",
                     absl::FormatDuration(absl::Trunc(absl::Now() - began, absl::Milliseconds(1))),
                     ": every rank is at seq ", progress->last_seq, ", the job goes on at step ",
                     progress->step, " (no step lost or repeated)");
    spdlog::info("job {}: {}", config_.name, summary);
    return states_.Transition(v1::READY, summary);
  }
  {
    // The ranks are in no known state, whether the roll back below loads
    // (which names it again) or ends the job FAILED.
    std::lock_guard<std::mutex> lock(mu_);
    ++state_generation_;
    state_checkpoint_.clear();
  }
  const absl::Status cause = absl::UnavailableError(
      absl::StrCat("the coordinator restarted and cannot re-adopt epoch ", record.epoch, ": ",
                   progress.status().message(), "; rolling back to the last checkpoint"));
  spdlog::warn("job {}: {}", config_.name, std::string(cause.message()));
  // A rollback is a recovery: within recovery.max_restarts, as any other.
  return OnBatchFailure(cause);
}

}  // namespace flatshard
