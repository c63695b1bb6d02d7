// TrainingJob's training: the step loop (Train), and the training operation
// that runs it on a coordinator thread of its own, so that it outlives the
// client that started it (docs/fault-tolerance.md, "Training outlives its
// client"): clients attach to it and stream, ask it to stop, and a restarted
// coordinator resumes it from the state dir.
#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "rpc/command_batch.h"
#include "spdlog/spdlog.h"

#include "coordinator/training_job.h"
#include "core/status_macros.h"
#include "core/step_program.h"

namespace flatshard {
namespace {

// No-sync micro-steps per step: gradient accumulation over more than this is
// a mistake, and a huge value would make one step run practically forever.
constexpr int kMaxMicroSteps = 1024;

absl::Status CheckTrainRequest(int64_t steps, int micro_steps) {
  if (steps <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("train.steps must be positive, got ", steps));
  }
  if (micro_steps < 0 || micro_steps > kMaxMicroSteps) {
    return absl::InvalidArgumentError(absl::StrCat(
        "train.no_sync_micro_steps must be between 0 and ", kMaxMicroSteps, ", got ", micro_steps));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status TrainingJob::Train(int64_t steps, int micro_steps,
                                const std::function<bool(const v1::StepResult&)>& on_step,
                                const std::function<void()>& on_started,
                                const EndedHook& on_ended) {
  RETURN_IF_ERROR(CheckTrainRequest(steps, micro_steps));
  ASSIGN_OR_RETURN(OperationLock op, BeginOperation("train"));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!unsharded_.empty()) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot train while units ", absl::StrJoin(unsharded_, ","),
                       " are manually unsharded; reshard them first (flatshard reshard)"));
    }
  }
  const v1::JobState from = states_.state();
  RETURN_IF_ERROR(
      states_.TransitionFrom(from, v1::TRAINING, absl::StrCat("training ", steps, " steps")));
  {
    std::lock_guard<std::mutex> lock(mu_);
    training_ = true;
  }
  if (on_started) on_started();
  // Saves other clients asked for while this Train ran are never left
  // waiting: they run after the last step, or fail with the job's failure.
  struct DrainSaves {
    TrainingJob* job;
    ~DrainSaves() {
      const bool failed = job->states_.state() == v1::FAILED;
      job->RunPendingSaves(failed ? absl::FailedPreconditionError(absl::StrCat(
                                        "the job failed before the checkpoint could be taken: ",
                                        job->states_.failure()))
                                  : absl::OkStatus(),
                           /*last=*/true);
    }
  } drain{this};
  // The workers compile the same programs from the same job (FsdpRuntime::
  // CompileProgram) and refuse a step whose digest differs. A recovery may
  // change the world size, and with it the programs.
  struct Programs {
    int world = 0;
    StepProgram synced, micro;
  } programs;
  // With a state store, each step batch's journal record is written while
  // the batch before it runs (JournalAhead), and the batch itself built
  // then: `ahead`, used when it is what comes next.
  bool journal_ahead = false;
  {
    std::lock_guard<std::mutex> persist(persist_mu_);
    journal_ahead = state_store_ != nullptr && options_.journal_ahead;
  }
  std::optional<v1::CommandBatch> ahead;
  const auto compile = [&] {
    const int world = world_size();
    if (programs.world == world) return;
    ahead.reset();
    const auto program = [&](bool sync_gradients) {
      return CompileStepProgram(
          index_, units_,
          StepProgramOptionsFor(config_.sharding, config_.optimizer, world, sync_gradients));
    };
    programs = {world, program(true), program(false)};
  };
  int64_t target = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    target = step_ + steps;  // a recovery rewinds step_; Train still ends at target
  }
  const auto current_step = [&] {
    std::lock_guard<std::mutex> lock(mu_);
    return step_;
  };

  bool stopped_by_client = false;
  std::optional<v1::Recovery> recovered;  // reported with the next step
  // A batch failed: recover (OnBatchFailure fails the job when it cannot),
  // then train on from the step the recovery left the job at.
  const auto recover = [&](const absl::Status& failure) -> absl::Status {
    RETURN_IF_ERROR(OnBatchFailure(failure));
    recovered = last_recovery();
    return states_.TransitionFrom(
        v1::READY, v1::TRAINING,
        absl::StrCat("training resumes at step ", current_step(), " of ", target));
  };
  while (current_step() < target && !stopped_by_client) {
    compile();
    const int world = programs.world;
    const absl::Time start = absl::Now();
    v1::StepResult result;
    result.set_total_steps(steps);
    result.set_target_step(target);
    std::vector<double> losses(static_cast<size_t>(world), 0.0);
    int64_t samples = 0;
    absl::Status failed;
    for (int k = 0; k <= micro_steps && failed.ok(); ++k) {
      const bool sync = k == micro_steps;
      int64_t data_position = 0;
      {
        std::lock_guard<std::mutex> lock(mu_);
        data_position = data_position_;
      }
      const StepProgram& program = sync ? programs.synced : programs.micro;
      // Built from the same programs (compile() drops it when they change),
      // so the same when it is for the same position and sync.
      std::optional<v1::CommandBatch> built = std::exchange(ahead, std::nullopt);
      v1::CommandBatch batch = built.has_value() && built->step().step() == data_position &&
                                       built->step().sync_gradients() == sync
                                   ? *std::move(built)
                                   : MakeStepBatch(program, data_position, sync);
      // The batch after this one, unless this is the last of the operation.
      CommandSequencer::WhileRunning while_running;
      if (journal_ahead && !(sync && current_step() + 1 >= target)) {
        const bool next_sync = sync ? micro_steps == 0 : k + 1 == micro_steps;
        while_running = [&, next_sync, data_position](const v1::CommandBatch& sent) {
          ahead = MakeStepBatch(next_sync ? programs.synced : programs.micro, data_position + 1,
                                next_sync);
          JournalAhead(sent, *ahead);
        };
      }
      absl::StatusOr<std::vector<v1::CommandResult>> results =
          sequencer()->Run(std::move(batch), while_running);
      if (!results.ok()) {
        failed = results.status();
        break;
      }
      double compute = 0, comm = 0;
      for (const v1::CommandResult& r : *results) {
        losses[static_cast<size_t>(r.rank())] += r.loss() / static_cast<double>(micro_steps + 1);
        samples += r.samples();
        compute = std::max(compute, r.compute_seconds());
        comm = std::max(comm, r.exposed_comm_seconds());
      }
      result.set_compute_seconds(result.compute_seconds() + compute);
      result.set_exposed_comm_seconds(result.exposed_comm_seconds() + comm);
      if (sync) result.set_grad_norm((*results)[0].grad_norm());
      std::lock_guard<std::mutex> lock(mu_);
      ++data_position_;
    }
    if (!failed.ok()) {
      RETURN_IF_ERROR(recover(failed));
      continue;
    }
    double sum = 0;
    for (double loss : losses) {
      result.add_rank_losses(loss);
      sum += loss;
    }
    result.set_loss(sum / static_cast<double>(world));
    {
      std::lock_guard<std::mutex> lock(mu_);
      result.set_step(++step_);
      result.set_seq(sequencer_->last_seq());
    }
    PersistProgress();
    if (recovered.has_value()) {
      *result.mutable_recovery() = *recovered;
      recovered.reset();
    }
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    result.set_step_seconds(seconds);
    result.set_samples_per_second(seconds > 0 ? static_cast<double>(samples) / seconds : 0.0);
    if (options_.observer != nullptr) options_.observer->OnStep(config_.name, result, samples);
    stopped_by_client = !on_step(result);
    if (absl::Status snapshot = MaybeTakePeerSnapshot(); !snapshot.ok()) {
      RETURN_IF_ERROR(recover(snapshot));
      continue;
    }
    RunPendingSaves(absl::OkStatus(), /*last=*/false);
    if (absl::Status scheduled = MaybeScheduledSave(); !scheduled.ok()) {
      // A save that failed because a rank did recovered the job; training
      // goes on from the checkpoint it restored.
      if (states_.state() == v1::READY) {
        RETURN_IF_ERROR(states_.TransitionFrom(
            v1::READY, v1::TRAINING,
            absl::StrCat("training resumes at step ", current_step(), " of ", target)));
        recovered = last_recovery();
        continue;
      }
      if (states_.state() != v1::TRAINING) return scheduled;
      const std::string why =
          absl::StrCat("training stopped: scheduled checkpoint failed: ", scheduled.message());
      if (on_ended) on_ended(scheduled, why);
      RETURN_IF_ERROR(states_.Transition(v1::IDLE, why));
      return scheduled;
    }
    if (absl::Status grown = MaybeGrow(); !grown.ok()) return grown;  // the job FAILED
    if (states_.state() == v1::READY) {  // it grew: a new epoch, a bigger world
      RETURN_IF_ERROR(
          states_.TransitionFrom(v1::READY, v1::TRAINING,
                                 absl::StrCat("training resumes at step ", current_step(), " of ",
                                              target, " at world size ", world_size())));
    }
  }
  const std::string outcome = stopped_by_client
                                  ? absl::StrCat("stopped on request at step ", current_step())
                                  : absl::StrCat("trained to step ", target);
  // Before IDLE is visible: whoever sees IDLE finds the operation ended.
  if (on_ended) on_ended(absl::OkStatus(), outcome);
  RETURN_IF_ERROR(states_.Transition(v1::IDLE, absl::StrCat("training ", outcome)));
  if (stopped_by_client) return absl::CancelledError("training was stopped on request");
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<TrainingRun>> TrainingJob::StartTraining(
    int64_t steps, int micro_steps, const std::string& started_by) {
  RETURN_IF_ERROR(CheckTrainRequest(steps, micro_steps));
  v1::TrainingOperation op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (steps > std::numeric_limits<int64_t>::max() - step_) {
      return absl::InvalidArgumentError(
          absl::StrCat("train.steps ", steps, " would take the job past the last step (",
                       std::numeric_limits<int64_t>::max(), ") from step ", step_));
    }
    op.set_target_step(step_ + steps);
  }
  op.set_no_sync_micro_steps(micro_steps);
  op.set_started_by(started_by);
  op.set_started_at_unix(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
  return LaunchRun(op);
}

absl::StatusOr<std::shared_ptr<TrainingRun>> TrainingJob::LaunchRun(
    const v1::TrainingOperation& op) {
  auto run = std::make_shared<TrainingRun>(op);
  std::thread finished;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return absl::FailedPreconditionError("the job is being stopped");
    if (run_ != nullptr && run_->operation().running()) {
      const v1::TrainingOperation running = run_->operation();
      return absl::FailedPreconditionError(
          absl::StrCat("cannot train: job '", config_.name, "' is already training to step ",
                       running.target_step(), " (started by ", running.started_by(),
                       "); follow it with `flatshard train --attach -j ", config_.name,
                       "`, or stop it with `flatshard job stop -j ", config_.name, "`"));
    }
    finished = std::move(trainer_);  // the previous run's thread, done
    run_ = run;
    trainer_ = std::thread([this, run] { RunTraining(run); });
  }
  if (finished.joinable()) finished.join();
  // The operation slot taken (TRAINING) or the reason it could not be.
  RETURN_IF_ERROR(run->WaitStarted(absl::InfiniteFuture()));
  return run;
}

void TrainingJob::RunTraining(const std::shared_ptr<TrainingRun>& run) {
  const v1::TrainingOperation op = run->operation();
  int64_t steps = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    steps = op.target_step() - step_;
  }
  if (steps <= 0) {
    run->Finish(absl::OkStatus(), absl::StrCat("already at step ", op.target_step()));
    SaveOperation(std::nullopt);
    return;
  }
  // A coordinator shutting down has detached the store: the operation stays
  // there, and the next start resumes it. A run refused before it started
  // (the job RECOVERING after a coordinator restart) stored nothing, and the
  // stored operation it would clear is the one that restart resumes.
  bool started = false;
  const auto end = [&](const absl::Status& status, const std::string& outcome) {
    if (started) SaveOperation(std::nullopt);
    run->MarkEnded(status, outcome);
  };
  const absl::Status status = Train(
      steps, op.no_sync_micro_steps(),
      [&](const v1::StepResult& result) {
        run->Publish(result);
        return !run->stop_requested();
      },
      [&] {
        SaveOperation(op);
        started = true;
        run->MarkStarted();
      },
      end);
  // Train ended it unless it failed (or never started); the slot is free now.
  if (!status.ok()) end(status, absl::StrCat("ended: ", status.message()));
  run->Finish(status, "");
}

void TrainingJob::SaveOperation(const std::optional<v1::TrainingOperation>& op) {
  std::lock_guard<std::mutex> persist(persist_mu_);
  if (state_store_ == nullptr) return;
  if (absl::Status s = state_store_->PutOperation(config_.name, op); !s.ok()) {
    spdlog::error("job {}: {}", config_.name, std::string(s.message()));
  }
}

std::shared_ptr<TrainingRun> TrainingJob::training() const {
  std::lock_guard<std::mutex> lock(mu_);
  return run_;
}

absl::StatusOr<int64_t> TrainingJob::StopTraining() {
  std::shared_ptr<TrainingRun> run = training();
  if (run == nullptr || !run->RequestStop()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", config_.name, "' is not training; nothing to stop"));
  }
  std::lock_guard<std::mutex> lock(mu_);
  return step_;
}

void TrainingJob::ResumeTraining() {
  std::optional<v1::TrainingOperation> op;
  {
    std::lock_guard<std::mutex> lock(mu_);
    op = std::move(resume_);
    resume_.reset();
  }
  if (!op.has_value()) return;
  absl::StatusOr<std::shared_ptr<TrainingRun>> run = LaunchRun(*op);
  if (run.ok()) {
    spdlog::info("job {}: resumed the training to step {} (started by {})", config_.name,
                 op->target_step(), op->started_by());
  } else {
    spdlog::error("job {}: the training to step {} could not be resumed: {}", config_.name,
                  op->target_step(), std::string(run.status().message()));
  }
}

}  // namespace flatshard
