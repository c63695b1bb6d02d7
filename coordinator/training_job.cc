#include "coordinator/training_job.h"

#include <chrono>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "rpc/command_batch.h"
#include "spdlog/spdlog.h"

#include "core/sharding.h"
#include "core/status_macros.h"
#include "core/step_program.h"

namespace flatshard {

absl::StatusOr<std::unique_ptr<TrainingJob>> TrainingJob::Create(const v1::JobSpec& spec,
                                                                 JobConfig config,
                                                                 TrainingJobOptions options) {
  ASSIGN_OR_RETURN(std::unique_ptr<TrainingJob> job,
                   Build(spec, std::move(config), std::move(options)));
  // A new job's history begins now: checkpoints an earlier job of its name
  // left in its directory are not its own until it loads one. (A restored
  // job takes its history back from its record instead.)
  absl::StatusOr<int64_t> start = job->HistoryStart();
  if (!start.ok()) {
    spdlog::warn("job '{}': its checkpoint history starts at the clock, after no listed save: {}",
                 job->config_.name, std::string(start.status().message()));
  }
  job->history_.since_unix_micros = start.value_or(absl::ToUnixMicros(job->CheckpointClock()));
  job->Persist();
  return job;
}

absl::StatusOr<std::unique_ptr<TrainingJob>> TrainingJob::Build(const v1::JobSpec& spec,
                                                                JobConfig config,
                                                                TrainingJobOptions options) {
  ASSIGN_OR_RETURN(ModelIndex index, IndexModel(config.model));
  ASSIGN_OR_RETURN(std::vector<Unit> units, ComputeUnits(index, config.wrap_policy));
  return std::unique_ptr<TrainingJob>(new TrainingJob(spec, std::move(config), std::move(index),
                                                      std::move(units), std::move(options)));
}

TrainingJob::TrainingJob(const v1::JobSpec& spec, JobConfig config, ModelIndex index,
                         std::vector<Unit> units, TrainingJobOptions options)
    : spec_(spec),
      config_(std::move(config)),
      index_(std::move(index)),
      units_(std::move(units)),
      options_(std::move(options)),
      states_(config_.name),
      epoch_config_(std::make_shared<const JobConfig>(config_)),
      state_store_(options_.state),
      catalog_(options_.checkpoint_root, config_.name) {
  if (options_.observer != nullptr) options_.observer->OnJobCreated(config_.name);
  WatchState();
}

TrainingJob::~TrainingJob() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  if (recoverer_.joinable()) recoverer_.join();
  if (trainer_.joinable()) trainer_.join();
  if (committer_.joinable()) committer_.join();
}

int TrainingJob::world_size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return epoch_config_->world_size;
}

int TrainingJob::restarts() const {
  std::lock_guard<std::mutex> lock(mu_);
  return restarts_;
}

std::optional<v1::Recovery> TrainingJob::last_recovery() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_recovery_;
}

v1::Job TrainingJob::ToProto() const {
  v1::Job job;
  std::lock_guard<std::mutex> lock(mu_);
  *job.mutable_spec() = spec_;
  job.set_state(states_.state());
  job.set_step(step_);
  job.set_state_checkpoint(state_checkpoint_);
  job.set_epoch(epoch_);
  if (sequencer_ != nullptr) job.set_last_seq(sequencer_->last_seq());
  job.set_failure(states_.failure());
  job.set_restarts(restarts_);
  job.set_world_size(epoch_config_->world_size);
  if (last_recovery_.has_value()) *job.mutable_last_recovery() = *last_recovery_;
  if (run_ != nullptr) *job.mutable_training() = run_->operation();
  for (const Unit& unit : units_) *job.add_units() = UnitToProto(unit);
  return job;
}

std::vector<std::string> TrainingJob::worker_ids() const {
  std::lock_guard<std::mutex> lock(mu_);
  return worker_ids_;
}

std::shared_ptr<CommandSequencer> TrainingJob::sequencer() const {
  std::lock_guard<std::mutex> lock(mu_);
  return sequencer_;
}

absl::Status TrainingJob::RefuseOperationIn(v1::JobState state, const char* what) const {
  const auto formed_before = [this] {
    std::lock_guard<std::mutex> lock(mu_);
    return !members_.empty();  // set by the first formation that succeeded
  };
  switch (state) {
    case v1::FORMING:
      // Re-forming (a recovery, or growing back at a checkpoint), through its
      // Configure and restore, once an epoch has formed: as transient as
      // RECOVERING, and no worker for the caller to start.
      if (formed_before()) {
        return absl::UnavailableError(
            absl::StrCat("cannot ", what, ": job '", config_.name,
                         "' is FORMING a new epoch (re-forming after a failure, or growing "
                         "back); try again when it is READY (flatshard job status)"));
      }
      [[fallthrough]];
    case v1::PENDING:
      return absl::FailedPreconditionError(
          absl::StrCat("cannot ", what, ": job '", config_.name, "' is ", v1::JobState_Name(state),
                       " (waiting for ", config_.world_size,
                       " workers to join and be configured; start them with flatshard-worker "
                       "--coordinator ADDRESS, and see `flatshard workers`)"));
    case v1::RECOVERING:
      // Transient: the job has no epoch to run commands in until it is
      // re-formed or its workers are re-adopted (after a coordinator restart
      // that waits for their heartbeats).
      return absl::UnavailableError(
          absl::StrCat("cannot ", what, ": job '", config_.name,
                       "' is RECOVERING (re-forming, or re-adopting its workers after a "
                       "coordinator restart); try again when it is READY (flatshard job status)"));
    case v1::FAILED:
      return absl::FailedPreconditionError(absl::StrCat("cannot ", what, ": job '", config_.name,
                                                        "' FAILED: ", states_.failure(),
                                                        " (delete it and create it again)"));
    case v1::STOPPED:
      return absl::FailedPreconditionError(
          absl::StrCat("cannot ", what, ": job '", config_.name, "' is STOPPED"));
    default:
      return absl::OkStatus();
  }
}

absl::StatusOr<TrainingJob::OperationLock> TrainingJob::BeginOperation(const char* what) {
  RETURN_IF_ERROR(RefuseOperationIn(states_.state(), what));
  OperationLock op(op_mu_, std::try_to_lock);
  if (const v1::JobState now = states_.state();
      !op.owns_lock() && (now == v1::READY || now == v1::IDLE)) {
    // Against the system clock: libstdc++ waits for a steady-clock deadline
    // with pthread_mutex_clocklock, which GCC 12's ThreadSanitizer does not
    // intercept (it then reports the unlock as one of an unlocked mutex).
    (void)op.try_lock_until(std::chrono::system_clock::now() + std::chrono::seconds(5));
  }
  if (!op.owns_lock()) {
    std::string holder;
    {
      std::lock_guard<std::mutex> lock(mu_);
      holder = absl::StrCat(
          op_what_, " for ",
          absl::FormatDuration(absl::Trunc(absl::Now() - op_since_, absl::Milliseconds(100))));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot ", what, ": job '", config_.name, "' is busy (", v1::JobState_Name(states_.state()),
        ", ", holder, "); one operation runs at a time, try again when it finishes"));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    NoteOperationLocked(what);
  }
  // Whoever held the slot may have left the job in another state (a recovery
  // that failed, a restart's restore): checked again now that none can.
  RETURN_IF_ERROR(RefuseOperationIn(states_.state(), what));
  if (sequencer() == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot ", what, ": job '", config_.name,
                                               "' has no workers formed yet; try again when it "
                                               "is READY"));
  }
  return op;
}

void TrainingJob::NoteOperationLocked(const char* what) {
  op_what_ = what;
  op_since_ = absl::Now();
}

void TrainingJob::FailWith(const absl::Status& status) {
  (void)states_.Transition(v1::FAILED, std::string(status.message()));
}

absl::StatusOr<std::vector<int>> TrainingJob::CheckUnits(const std::vector<int>& units) const {
  std::vector<int> out = units;
  if (out.empty()) {
    for (const Unit& unit : units_) out.push_back(unit.index);
  }
  for (int u : out) {
    if (u < 0 || u >= static_cast<int>(units_.size())) {
      return absl::InvalidArgumentError(
          absl::StrCat("unit_indices: unit ", u, " does not exist (job '", config_.name,
                       "' has units 0..", units_.size() - 1, "; see `flatshard job status`)"));
    }
  }
  return out;
}

absl::Status TrainingJob::RunControl(const StepProgram& commands) {
  absl::StatusOr<std::vector<v1::CommandResult>> results =
      sequencer()->Run(MakeControlBatch(commands));
  if (!results.ok()) {
    (void)OnBatchFailure(results.status());
    return results.status();
  }
  return absl::OkStatus();
}

absl::Status TrainingJob::Unshard(const std::vector<int>& units) {
  ASSIGN_OR_RETURN(std::vector<int> which, CheckUnits(units));
  ASSIGN_OR_RETURN(OperationLock op, BeginOperation("unshard"));
  StepProgram commands;
  for (int u : which) commands.push_back(StepCommand::Unshard(u, /*prefetch=*/false));
  RETURN_IF_ERROR(RunControl(commands));
  std::lock_guard<std::mutex> lock(mu_);
  unsharded_.insert(which.begin(), which.end());
  return absl::OkStatus();
}

absl::Status TrainingJob::Reshard(const std::vector<int>& units) {
  ASSIGN_OR_RETURN(std::vector<int> which, CheckUnits(units));
  ASSIGN_OR_RETURN(OperationLock op, BeginOperation("reshard"));
  StepProgram commands;
  for (int u : which) commands.push_back(StepCommand::Reshard(u));
  RETURN_IF_ERROR(RunControl(commands));
  std::lock_guard<std::mutex> lock(mu_);
  for (int u : which) unsharded_.erase(u);
  return absl::OkStatus();
}

absl::Status TrainingJob::Summon(bool with_grads, int64_t chunk_bytes,
                                 const WorkerClient::ChunkSink& sink) {
  if (chunk_bytes < 0 || chunk_bytes > kMaxSummonChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("chunk_bytes must be between 0 (4 MiB) and ",
                                                   kMaxSummonChunkBytes, ", got ", chunk_bytes));
  }
  if (with_grads && !config_.sharding.use_orig_params) {
    return absl::InvalidArgumentError(
        "with_grads needs sharding.use_orig_params: true (FSDP's summon_full_params rule)");
  }
  ASSIGN_OR_RETURN(OperationLock op, BeginOperation("summon parameters"));
  v1::CommandBatch batch;
  batch.mutable_summon()->set_with_grads(with_grads);
  batch.mutable_summon()->set_chunk_bytes(chunk_bytes);
  const std::shared_ptr<CommandSequencer> seq = sequencer();
  absl::Status status = seq->Summon(std::move(batch), sink);
  if (!status.ok() && !seq->failure().ok()) (void)OnBatchFailure(status);
  return status;
}

v1::StateDictSettings TrainingJob::SetStateDictSettings(const v1::StateDictSettings& settings) {
  std::lock_guard<std::mutex> lock(mu_);
  v1::StateDictSettings previous = spec_.state_dict_settings();
  *spec_.mutable_state_dict_settings() = settings;
  return previous;
}

void TrainingJob::Stop(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;  // a recovery in progress gives up
  }
  if (const std::shared_ptr<CommandSequencer> seq = sequencer(); seq != nullptr) {
    seq->Fail(-1, absl::CancelledError(reason));
  }
  std::vector<std::shared_ptr<WorkerClient>> forming;
  {
    // Also wakes a background commit waiting on AwaitSave, even when the
    // sequencer had already failed (and so cancelled nothing above).
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& client : clients_) client->CancelAll();
    forming = AbandonFormationLocked(-1, absl::CancelledError(reason));  // when one is in progress
  }
  CancelFormation(forming);
  (void)states_.Transition(v1::STOPPED, reason);
  states_.Close();
  // A recovery thread sees stopping_ and ends; none may outlive the stop (it
  // calls back into the coordinator's membership). The training operation's
  // Train returns with the sequencer's failure.
  std::thread recoverer, trainer;
  {
    std::lock_guard<std::mutex> lock(mu_);
    recoverer = std::move(recoverer_);
    trainer = std::move(trainer_);
  }
  if (recoverer.joinable()) recoverer.join();
  if (trainer.joinable()) trainer.join();
}

void TrainingJob::StopForShutdown(const std::string& reason, const absl::Status& watchers_end) {
  DetachState();
  states_.Close(watchers_end);  // before Stop's FAILED or STOPPED events
  Stop(reason);
}

std::optional<uint64_t> TrainingJob::AbortEpochFor(const std::string& worker_id) const {
  if (states_.state() != v1::FAILED && states_.state() != v1::STOPPED) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : worker_ids_) {
    if (id == worker_id) return epoch_;
  }
  return std::nullopt;
}

}  // namespace flatshard
