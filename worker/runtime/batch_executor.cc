#include "worker/runtime/batch_executor.h"

#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "rpc/checkpoint_file_proto.h"
#include "rpc/command_batch.h"
#include "rpc/status_proto.h"
#include "rpc/step_program_proto.h"

#include "core/status_macros.h"
#include "core/step_program.h"

namespace flatshard {

v1::CommandBatch BatchExecutor::MakeBatch(int64_t step, bool sync_gradients) const {
  const StepProgram program = runtime_->CompileProgram(sync_gradients);
  v1::CommandBatch batch = MakeStepBatch(program, step, sync_gradients);
  batch.set_job_epoch(epoch_);
  batch.set_seq(last_seq_ + 1);
  return batch;
}

absl::Status BatchExecutor::CheckBatch(const v1::CommandBatch& batch,
                                       v1::CommandBatch::KindCase expected) const {
  const auto refuse = [&](absl::StatusCode code, absl::string_view why) {
    return absl::Status(code, absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ",
                                           batch.seq(), ": ", why));
  };
  if (!failure_.ok()) {
    return refuse(
        absl::StatusCode::kFailedPrecondition,
        absl::StrCat("an earlier batch failed (", failure_.message(), "); re-form the job"));
  }
  if (batch.job_epoch() != epoch_) {
    return refuse(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("it is for job epoch ", batch.job_epoch(),
                               ", this worker is in epoch ", epoch_));
  }
  if (batch.seq() != last_seq_ + 1) {
    return refuse(absl::StatusCode::kFailedPrecondition,
                  absl::StrCat("out of order, expected seq ", last_seq_ + 1));
  }
  absl::StatusOr<std::string> sent_digest = BatchDigest(batch);
  if (!sent_digest.ok()) {
    return refuse(absl::StatusCode::kInvalidArgument, sent_digest.status().message());
  }
  if (*sent_digest != batch.digest()) {
    return refuse(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("digest mismatch (batch says ", absl::BytesToHexString(batch.digest()),
                     ", its content hashes to ", absl::BytesToHexString(*sent_digest), ")"));
  }
  if (batch.kind_case() != expected) {
    return refuse(absl::StatusCode::kInvalidArgument,
                  absl::StrCat("it is a ", BatchKindName(batch.kind_case()), " batch, not a ",
                               BatchKindName(expected), " batch"));
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::CommandResult> BatchExecutor::Execute(const v1::CommandBatch& batch,
                                                         const compute::Batch& data) {
  RETURN_IF_ERROR(CheckBatch(batch, v1::CommandBatch::kStep));
  staged_.reset();  // a stage whose apply never came (see Run)
  const v1::StepBatch& step = batch.step();
  ASSIGN_OR_RETURN(StepProgram program, StepProgramFromProto(step.commands(), "step.commands"));
  const StepProgram expected = runtime_->CompileProgram(step.sync_gradients());
  if (ProgramDigest(expected, step.step(), step.sync_gradients()) != batch.digest()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(),
                     ": its program differs from the one this worker compiles for the job (",
                     program.size(), " vs ", expected.size(),
                     " commands); coordinator and worker disagree on the job's configuration"));
  }
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
  // Every batch but a step may change the state (loads, restores) or take a
  // new snapshot of it: a snapshot still copying is waited for first.
  absl::Status status = runtime_->AwaitSnapshotCopies();
  // A stage is for the apply that comes next: when another rank's stage
  // failed, the coordinator sends no apply, and whatever it sends instead
  // drops this one's staged copy of the rank's state (a whole shard and its
  // optimizer state) rather than keep it beside training.
  const bool apply = batch.has_checkpoint() && batch.checkpoint().has_load_shard() &&
                     batch.checkpoint().load_shard().apply();
  if (!apply) staged_.reset();
  if (status.ok()) status = run();
  if (!status.ok()) {
    failure_ = status;
    return status;
  }
  last_seq_ = batch.seq();
  return absl::OkStatus();
}

absl::Status BatchExecutor::ExecuteControl(const v1::CommandBatch& batch) {
  RETURN_IF_ERROR(CheckBatch(batch, v1::CommandBatch::kControl));
  ASSIGN_OR_RETURN(StepProgram program,
                   StepProgramFromProto(batch.control().commands(), "control.commands"));
  for (const StepCommand& command : program) {
    if (command.op != StepCommand::Op::kUnshard && command.op != StepCommand::Op::kReshard &&
        command.op != StepCommand::Op::kBarrier) {
      return absl::InvalidArgumentError(
          absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(), ": ",
                       DescribeCommand(command), " is not a control command"));
    }
  }
  return Run(batch, [&] { return runtime_->RunControl(program); });
}

absl::Status BatchExecutor::ExecuteSummon(
    const v1::CommandBatch& batch, const std::function<absl::Status(SummonedParams&)>& body) {
  RETURN_IF_ERROR(CheckBatch(batch, v1::CommandBatch::kSummon));
  SummonOptions options;
  options.writeback = false;
  options.rank0_only = true;
  options.with_grads = batch.summon().with_grads();
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
  *result.mutable_checkpoint_status() = StatusToProto(status);
}

}  // namespace

absl::StatusOr<v1::CommandResult> BatchExecutor::ExecutePeerSnapshot(
    const v1::CommandBatch& batch, const std::function<absl::Status(v1::CommandResult&)>& body) {
  RETURN_IF_ERROR(CheckBatch(batch, v1::CommandBatch::kCheckpoint));
  if (!batch.checkpoint().has_take_peer_snapshot() &&
      !batch.checkpoint().has_restore_peer_snapshot()) {
    return absl::InvalidArgumentError(absl::StrCat("worker rank ", runtime_->rank(),
                                                   " refuses batch seq ", batch.seq(),
                                                   ": not a peer snapshot batch"));
  }
  if (batch.checkpoint().has_restore_peer_snapshot()) {
    // Checked before it runs: a malformed request issued no collective, so
    // it must not poison the executor (Run's failure_) as a failed one does.
    const v1::CheckpointBatch::RestorePeerSnapshot& restore =
        batch.checkpoint().restore_peer_snapshot();
    if (restore.from_world_size() < 1 || restore.holder_size() != restore.from_world_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("restore_peer_snapshot: holder names ", restore.holder_size(),
                       " ranks for a world of size ", restore.from_world_size()));
    }
    for (const int h : restore.holder()) {
      if (h < 0 || h >= runtime_->world_size()) {
        return absl::InvalidArgumentError(absl::StrCat("restore_peer_snapshot: holder rank ", h,
                                                       " is outside a world of size ",
                                                       runtime_->world_size()));
      }
    }
  }
  v1::CommandResult result;
  result.set_seq(batch.seq());
  result.set_rank(runtime_->rank());
  RETURN_IF_ERROR(Run(batch, [&] { return body(result); }));
  return result;
}

absl::StatusOr<v1::CommandResult> BatchExecutor::ExecuteCheckpoint(
    const v1::CommandBatch& batch, const std::string& checkpoint_root,
    std::optional<ShardSnapshot>* snapshot) {
  RETURN_IF_ERROR(CheckBatch(batch, v1::CommandBatch::kCheckpoint));
  const v1::CheckpointBatch& command = batch.checkpoint();
  if (!command.has_save_shard() && !command.has_load_shard()) {
    return absl::InvalidArgumentError(
        absl::StrCat("worker rank ", runtime_->rank(), " refuses batch seq ", batch.seq(),
                     ": a checkpoint batch here holds one save_shard or load_shard"));
  }
  const std::string& directory = command.has_save_shard() ? command.save_shard().directory()
                                                          : command.load_shard().directory();
  RETURN_IF_ERROR(CheckCheckpointDirectory(directory));
  const std::string path = absl::StrCat(checkpoint_root, "/", directory);
  v1::CommandResult result;
  result.set_seq(batch.seq());
  result.set_rank(runtime_->rank());
  RETURN_IF_ERROR(Run(batch, [&]() -> absl::Status {
    if (command.has_save_shard()) {
      // The coordinator made the directory when it began the save and removes
      // it when it abandons the save (a rank failed): a rank that got here
      // after that must not make it again, or the abandoned save's files
      // outlive it. The writers never make it (a file's creation in a removed
      // directory fails, whatever a cache said); this check names the cause.
      // Not asked by making it: another worker on the same file system would
      // see that directory while it stood and write into it.
      std::error_code ec;
      const std::filesystem::file_status found = std::filesystem::status(path, ec);
      if (!std::filesystem::is_directory(found)) {
        // Still run the save, its writes failing: the rank reports the error
        // with the others' outcomes and stays in sequence.
        SetError(result, absl::FailedPreconditionError(absl::StrCat(
                             "checkpoint directory ", path,
                             std::filesystem::exists(found) ? " is not a directory"
                             : !ec || ec == std::errc::no_such_file_or_directory
                                 ? " is not there: the coordinator abandoned this save, or this "
                                   "worker's --checkpoint-dir is not the coordinator's "
                                   "--checkpoint-root"
                                 : absl::StrCat(" cannot be used: ", ec.message()))));
      }
      v1::StateDictType type = command.save_shard().settings().state_dict_type();
      if (type == v1::STATE_DICT_TYPE_UNSPECIFIED) type = v1::FULL_STATE_DICT;
      if (command.save_shard().async_save()) {
        ASSIGN_OR_RETURN(ShardSnapshot taken, SnapshotShardCheckpoint(*runtime_, type));
        *snapshot = std::move(taken);
        return absl::OkStatus();
      }
      ASSIGN_OR_RETURN(ShardSaveResult saved, SaveShardCheckpoint(*runtime_, path, type));
      if (!saved.write_status.ok() && !result.has_checkpoint_status()) {
        SetError(result, saved.write_status);
      }
      for (const CheckpointFile& f : saved.files) {
        CheckpointFileToProto(f, result.add_files());
      }
      return absl::OkStatus();
    }
    if (!command.load_shard().apply()) {
      staged_.reset();
      absl::StatusOr<StagedCheckpoint> staged = StageShardCheckpoint(*runtime_, path);
      // An aborted stage is the batch's failure, not the checkpoint's: as a
      // checkpoint status the coordinator would take it for this rank's
      // failure to read the checkpoint and blame the rank.
      if (staged.status().code() == absl::StatusCode::kAborted) return staged.status();
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
