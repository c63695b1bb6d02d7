#include "coordinator/training_job.h"

#include <chrono>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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

absl::Status CheckOneDeviceKind(const std::vector<WorkerRecord>& members) {
  std::map<std::string, std::vector<std::string>> by_kind;
  for (const WorkerRecord& m : members) by_kind[m.device].push_back(m.worker_id);
  if (by_kind.size() <= 1) return absl::OkStatus();
  std::vector<std::string> parts;
  parts.reserve(by_kind.size());
  for (const auto& [kind, ids] : by_kind) {
    parts.push_back(absl::StrCat(kind, ": ", absl::StrJoin(ids, ", ")));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the job's workers mix device kinds (", absl::StrJoin(parts, "; "),
                   "); a job runs on one kind of device: stop the others or start workers with "
                   "the same --device"));
}

absl::Status TrainingJob::Form(const std::vector<WorkerRecord>& members) {
  OperationLock op(op_mu_);
  v1::JobSpec spec;
  {
    std::lock_guard<std::mutex> lock(mu_);
    NoteOperationLocked("form the job");
    spec = spec_;
  }
  if (absl::Status formed = FormLocked(members, spec, std::make_shared<const JobConfig>(config_));
      !formed.ok()) {
    if (formed.code() != absl::StatusCode::kCancelled) FailWith(formed);
    return formed;
  }
  // The slot is free before anyone can see READY: a client that waited for
  // READY and sends its first operation at once must not find the job busy.
  op.unlock();
  return states_.Transition(v1::READY, absl::StrCat("epoch ", ToProto().epoch(), ": ",
                                                    members.size(), " workers configured"));
}

absl::Status TrainingJob::FormLocked(const std::vector<WorkerRecord>& members,
                                     const v1::JobSpec& spec,
                                     std::shared_ptr<const JobConfig> config,
                                     std::string* failed_worker) {
  if (static_cast<int>(members.size()) != config->world_size) {
    return absl::InternalError(
        absl::StrCat("forming with ", members.size(), " workers, need ", config->world_size));
  }
  {
    // Configure initializes the ranks' parameters from the seed. Before the
    // transition, whose record is written with it.
    std::lock_guard<std::mutex> lock(mu_);
    ++state_generation_;
    state_checkpoint_.clear();
  }
  RETURN_IF_ERROR(
      states_.Transition(v1::FORMING, absl::StrCat("configuring ", members.size(), " workers")));
  // One job, one kind of device: the ranks' collectives, kernels and
  // checkpoints assume the same memory and arithmetic everywhere.
  if (absl::Status kinds = CheckOneDeviceKind(members); !kinds.ok()) {
    (void)states_.Transition(v1::FAILED, std::string(kinds.message()));
    return kinds;
  }
  std::vector<std::shared_ptr<WorkerClient>> clients;
  std::vector<std::string> ids;
  for (const WorkerRecord& member : members) {
    clients.push_back(options_.connect(member));
    ids.push_back(member.worker_id);
  }
  uint64_t epoch = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    epoch = ++epoch_;
  }
  v1::ConfigureRequest request;
  request.set_job(config_.name);
  request.set_job_epoch(epoch);
  request.set_world_size(config->world_size);
  *request.mutable_spec() = spec;
  for (const Unit& unit : units_) *request.add_units() = UnitToProto(unit);
  const std::string prefix = absl::StrCat("job/", config_.name, "/epoch/", epoch);
  request.set_store_prefix(prefix + "/");
  // Configure is a collective (the ranks rendezvous), so all in parallel.
  {
    // Stop (SIGTERM, delete) and the heartbeat monitor cancel these calls
    // rather than wait for the configure timeout.
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::CancelledError("the job was stopped before it was formed");
    forming_ = Formation{prefix, ids, {}, absl::Now(), absl::OkStatus(), -1};
    for (auto& client : clients) forming_.clients.push_back(client.get());
  }
  std::vector<std::thread> threads;
  threads.reserve(members.size());
  const absl::Time deadline = absl::Now() + options_.configure_timeout;
  for (size_t r = 0; r < members.size(); ++r) {
    threads.emplace_back([&, r] {
      v1::ConfigureRequest mine = request;
      mine.set_rank(static_cast<int>(r));
      const absl::Status status = clients[r]->Configure(mine, deadline);
      if (status.ok()) return;
      // The others would wait for this rank until their rendezvous timeout.
      // A call cancelled by Stop or by another rank's failure comes after
      // that cause and is ignored; one cancelled first was cancelled by the
      // worker (its server shutting down), which is this rank's failure.
      const absl::StatusCode code = status.code() == absl::StatusCode::kCancelled
                                        ? absl::StatusCode::kUnavailable
                                        : status.code();
      std::lock_guard<std::mutex> lock(mu_);
      AbandonFormationLocked(
          static_cast<int>(r),
          absl::Status(code, absl::StrCat("rank ", r, " (worker ", members[r].worker_id, " at ",
                                          members[r].address,
                                          ") could not be configured: ", status.message())));
    });
  }
  for (std::thread& t : threads) t.join();
  Formation formed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    formed = std::exchange(forming_, Formation{});
    if (stopping_) return absl::CancelledError("the job was stopped while it was being formed");
  }
  if (!formed.failure.ok()) {
    // Not a candidate for the next try (a recovery retries; Form fails the job).
    const absl::StatusCode code = formed.failure.code();
    if (options_.mark_unreachable && formed.failed_rank >= 0 &&
        (code == absl::StatusCode::kUnavailable || code == absl::StatusCode::kDeadlineExceeded)) {
      options_.mark_unreachable(members[static_cast<size_t>(formed.failed_rank)]);
    }
    if (failed_worker != nullptr && formed.failed_rank >= 0) {
      *failed_worker = members[static_cast<size_t>(formed.failed_rank)].worker_id;
    }
    return formed.failure;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    // The old sequencer goes before the old clients it points at.
    std::vector<std::shared_ptr<WorkerClient>> old_clients =
        std::exchange(clients_, std::move(clients));
    sequencer_ = MakeSequencerLocked(epoch);
    worker_ids_ = std::move(ids);
    members_ = members;
    epoch_config_ = std::move(config);
    unsharded_.clear();
  }
  // Every rank is past the new epoch's rendezvous; the keys of the epochs
  // before it (the last formed one, and any whose formation failed) are garbage.
  uint64_t oldest = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    oldest = std::exchange(oldest_rendezvous_epoch_, epoch);
  }
  if (options_.rendezvous != nullptr) {
    for (uint64_t e = oldest; e < epoch; ++e) {
      options_.rendezvous->DeletePrefix(absl::StrCat("job/", config_.name, "/epoch/", e));
    }
  }
  return absl::OkStatus();
}

void TrainingJob::AbandonFormationLocked(int rank, const absl::Status& why) {
  if (forming_.prefix.empty() || !forming_.failure.ok()) return;  // the first cause stands
  forming_.failure = why;
  forming_.failed_rank = rank;
  for (WorkerClient* client : forming_.clients) client->CancelAll();
  if (options_.rendezvous != nullptr) {
    options_.rendezvous->Abandon(forming_.prefix, std::string(why.message()));
  }
}

bool TrainingJob::FailFormingWorker(const std::string& worker_id, absl::Time silent_since,
                                    absl::Duration timeout, absl::Time now,
                                    const absl::Status& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = std::find(forming_.ids.begin(), forming_.ids.end(), worker_id);
  if (it == forming_.ids.end() || !forming_.failure.ok()) return false;
  // Silent for a whole timeout within this formation: a worker marked
  // unreachable by the try before (it counts as stale until it heartbeats
  // again) that answered the probe and was seated again is given its chance.
  if (now - std::max(silent_since, forming_.started) <= timeout) return false;
  const int rank = static_cast<int>(it - forming_.ids.begin());
  AbandonFormationLocked(
      rank,
      absl::Status(reason.code(), absl::StrCat("rank ", rank, " (worker ", worker_id,
                                               ") could not be configured: ", reason.message())));
  return true;
}

std::unique_ptr<CommandSequencer> TrainingJob::MakeSequencerLocked(uint64_t epoch) {
  CommandSequencer::BatchObserver on_batch;
  if (JobObserver* observer = options_.observer; observer != nullptr) {
    on_batch = [observer, job = config_.name](const v1::CommandBatch& batch,
                                              absl::Duration round_trip) {
      observer->OnBatch(job, batch, round_trip);
    };
  }
  auto sequencer = std::make_unique<CommandSequencer>(clients_, epoch, options_.batch_timeout,
                                                      std::move(on_batch));
  // The state store's write-ahead record of every batch (training_job_state.cc).
  sequencer->set_journal([this](const v1::CommandBatch& batch) { JournalBatch(batch); });
  return sequencer;
}

absl::Status TrainingJob::RefuseOperationIn(v1::JobState state, const char* what) const {
  switch (state) {
    case v1::PENDING:
    case v1::FORMING:
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
  {
    // Also wakes a background commit waiting on AwaitSave, even when the
    // sequencer had already failed (and so cancelled nothing above).
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& client : clients_) client->CancelAll();
    AbandonFormationLocked(-1, absl::CancelledError(reason));  // when one is in progress
  }
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

std::optional<uint64_t> TrainingJob::AbortEpochFor(const std::string& worker_id) const {
  if (states_.state() != v1::FAILED && states_.state() != v1::STOPPED) return std::nullopt;
  std::lock_guard<std::mutex> lock(mu_);
  for (const std::string& id : worker_ids_) {
    if (id == worker_id) return epoch_;
  }
  return std::nullopt;
}

}  // namespace flatshard
