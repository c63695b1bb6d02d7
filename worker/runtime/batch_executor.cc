#include "worker/runtime/batch_executor.h"

#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "core/step_program.h"

namespace flatshard {

v1::CommandBatch BatchExecutor::MakeBatch(int64_t step, bool sync_gradients) const {
  v1::CommandBatch batch;
  batch.set_job_epoch(epoch_);
  batch.set_seq(last_seq_ + 1);
  batch.set_step(step);
  batch.set_sync_gradients(sync_gradients);
  const std::vector<v1::Command> program = runtime_->CompileProgram(sync_gradients);
  for (const v1::Command& command : program) *batch.add_commands() = command;
  batch.set_digest(ProgramDigest(program, step, sync_gradients));
  return batch;
}

absl::Status BatchExecutor::CheckSequence(const v1::CommandBatch& batch) const {
  if (!failure_.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(),
                     ": an earlier batch failed (", failure_.message(), "); re-form the job"));
  }
  if (batch.job_epoch() != epoch_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(),
        ": it is for job epoch ", batch.job_epoch(), ", this worker is in epoch ", epoch_));
  }
  if (batch.seq() != last_seq_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(),
                     ": out of order, expected seq ", last_seq_ + 1));
  }
  const std::vector<v1::Command> sent(batch.commands().begin(), batch.commands().end());
  const std::string sent_digest = ProgramDigest(sent, batch.step(), batch.sync_gradients());
  if (sent_digest != batch.digest()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(),
                     ": digest mismatch (batch says ", absl::BytesToHexString(batch.digest()),
                     ", its commands hash to ", absl::BytesToHexString(sent_digest), ")"));
  }
  return absl::OkStatus();
}

absl::Status BatchExecutor::Check(const v1::CommandBatch& batch) const {
  RETURN_IF_ERROR(CheckSequence(batch));
  if (batch.control()) {
    return absl::InvalidArgumentError(absl::StrCat("worker rank ", runtime_->rank(),
                                                   " refuses batch seq ", batch.seq(),
                                                   ": it is a control batch, not a training step"));
  }
  const std::vector<v1::Command> sent(batch.commands().begin(), batch.commands().end());
  const std::string& sent_digest = batch.digest();
  const std::vector<v1::Command> expected = runtime_->CompileProgram(batch.sync_gradients());
  const std::string expected_digest = ProgramDigest(expected, batch.step(), batch.sync_gradients());
  if (expected_digest != sent_digest) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(),
                     ": its program differs from the one this worker compiles for the job (",
                     sent.size(), " vs ", expected.size(),
                     " commands); coordinator and worker disagree on the job's configuration"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CommandResult> BatchExecutor::Execute(const v1::CommandBatch& batch,
                                                         const compute::Batch& data) {
  RETURN_IF_ERROR(Check(batch));
  const std::vector<v1::Command> program(batch.commands().begin(), batch.commands().end());
  absl::StatusOr<StepStats> stats = runtime_->RunStep(program, data);
  if (!stats.ok()) {
    failure_ = stats.status();
    return stats.status();
  }
  last_seq_ = batch.seq();
  v1::CommandResult result;
  result.set_seq(batch.seq());
  result.set_loss(stats->loss);
  result.set_grad_norm(stats->grad_norm);
  result.set_compute_seconds(stats->compute_seconds);
  result.set_exposed_comm_seconds(stats->exposed_comm_seconds);
  result.set_optimizer_seconds(stats->optimizer_seconds);
  result.set_samples(data.batch_size);
  return result;
}

absl::Status BatchExecutor::Run(const v1::CommandBatch& batch,
                                const std::function<absl::Status()>& run) {
  absl::Status status = run();
  if (!status.ok()) {
    failure_ = status;
    return status;
  }
  last_seq_ = batch.seq();
  return absl::OkStatus();
}

absl::Status BatchExecutor::ExecuteControl(const v1::CommandBatch& batch) {
  RETURN_IF_ERROR(CheckSequence(batch));
  if (!batch.control()) {
    return absl::InvalidArgumentError(absl::StrCat("worker rank ", runtime_->rank(),
                                                   " refuses batch seq ", batch.seq(),
                                                   ": a training step sent as a control batch"));
  }
  const std::vector<v1::Command> program(batch.commands().begin(), batch.commands().end());
  for (const v1::Command& command : program) {
    if (!command.has_unshard() && !command.has_reshard() && !command.has_barrier()) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(), ": ",
                       DescribeCommand(command), " is not a control command"));
    }
  }
  return Run(batch, [&] { return runtime_->RunControl(program); });
}

absl::Status BatchExecutor::ExecuteSummon(
    const v1::CommandBatch& batch, const std::function<absl::Status(SummonedParams&)>& body) {
  RETURN_IF_ERROR(CheckSequence(batch));
  if (!batch.control() || batch.commands_size() != 1 ||
      !batch.commands(0).has_summon_full_params()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(),
                     ": a summon batch is one SummonFullParams control command"));
  }
  SummonOptions options;
  options.writeback = false;
  options.rank0_only = true;
  options.with_grads = batch.commands(0).summon_full_params().with_grads();
  return Run(batch, [&] { return runtime_->SummonFullParams(options, body); });
}

namespace {

// Checkpoint directories come from the coordinator but are still checked:
// "<job>/<name>" or "<job>/<name>.partial", nothing that climbs out of the root.
absl::Status CheckCheckpointDirectory(const std::string& directory) {
  const size_t slash = directory.find('/');
  const std::string job = directory.substr(0, slash);
  const std::string name = slash == std::string::npos ? "" : directory.substr(slash + 1);
  auto bad = [](const std::string& part) {
    return part.empty() || part == "." || part == ".." || part.find('/') != std::string::npos;
  };
  if (slash == std::string::npos || bad(job) || bad(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint directory '", directory, "' is not of the form <job>/<name>"));
  }
  return absl::OkStatus();
}

void SetError(v1::CommandResult& result, const absl::Status& status) {
  result.set_error_code(static_cast<int>(status.code()));
  result.set_error(std::string(status.message()));
}

}  // namespace

absl::StatusOr<v1::CommandResult> BatchExecutor::ExecuteCheckpoint(
    const v1::CommandBatch& batch, const std::string& checkpoint_root,
    std::optional<ShardSnapshot>* snapshot) {
  RETURN_IF_ERROR(CheckSequence(batch));
  if (!batch.control() || batch.commands_size() != 1 ||
      (!batch.commands(0).has_save_shard() && !batch.commands(0).has_load_shard())) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(),
                     ": a checkpoint batch is one SaveShard or LoadShard control command"));
  }
  const v1::Command& command = batch.commands(0);
  const std::string& directory = command.has_save_shard() ? command.save_shard().directory()
                                                          : command.load_shard().directory();
  RETURN_IF_ERROR(CheckCheckpointDirectory(directory));
  const std::string path = absl::StrCat(checkpoint_root, "/", directory);
  v1::CommandResult result;
  result.set_seq(batch.seq());
  result.set_rank(runtime_->rank());
  RETURN_IF_ERROR(Run(batch, [&]() -> absl::Status {
    if (command.has_save_shard()) {
      std::error_code ec;
      std::filesystem::create_directories(path, ec);
      if (ec) {
        // Still take part in the collectives: the save runs with writes failing.
        SetError(result,
                 absl::UnavailableError(absl::StrCat("cannot create ", path, ": ", ec.message())));
      }
      v1::StateDictType type = command.save_shard().settings().state_dict_type();
      if (type == v1::STATE_DICT_TYPE_UNSPECIFIED) type = v1::FULL_STATE_DICT;
      if (command.save_shard().async_save()) {
        ASSIGN_OR_RETURN(ShardSnapshot taken, SnapshotShardCheckpoint(*runtime_, type));
        *snapshot = std::move(taken);
        return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(ShardSaveResult saved, SaveShardCheckpoint(*runtime_, path, type));
      if (!saved.write_status.ok() && result.error_code() == 0) {
        SetError(result, saved.write_status);
      }
      for (const CheckpointFile& f : saved.files) {
        v1::CheckpointFileInfo* info = result.add_files();
        info->set_name(f.name);
        info->set_rank(f.rank);
        info->set_bytes(static_cast<int64_t>(f.bytes));
        info->set_xxh3(f.xxh3);
      }
      return absl::OkStatus();
    }
    if (!command.load_shard().apply()) {
      staged_.reset();
      absl::StatusOr<StagedCheckpoint> staged = StageShardCheckpoint(*runtime_, path);
      if (staged.ok()) {
        staged_ = *std::move(staged);
      } else {
        SetError(result, staged.status());
      }
      return absl::OkStatus();
    }
    if (!staged_.has_value()) {
      SetError(result, absl::FailedPreconditionError(
                           "nothing is staged: LoadShard apply must follow a successful stage"));
      return absl::OkStatus();
    }
    StagedCheckpoint staged = *std::move(staged_);
    staged_.reset();
    return ApplyStagedCheckpoint(*runtime_, std::move(staged));
  }));
  return result;
}

}  // namespace flatshard
