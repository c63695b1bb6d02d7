#include "rpc/command_batch.h"

#include "absl/strings/str_cat.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"
#include "google/protobuf/message.h"
#include "rpc/step_program_proto.h"

#include "core/status_macros.h"

namespace flatshard {

std::string CanonicalBytes(const google::protobuf::Message& message) {
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    // proto3 messages are always initialized, so this cannot fail.
    (void)message.SerializeToCodedStream(&coded);
  }
  return bytes;
}

v1::CommandBatch MakeStepBatch(const StepProgram& program, int64_t step, bool sync_gradients) {
  v1::CommandBatch batch;
  v1::StepBatch* kind = batch.mutable_step();
  StepProgramToProto(program, kind->mutable_commands());
  kind->set_step(step);
  kind->set_sync_gradients(sync_gradients);
  batch.set_digest(ProgramDigest(program, step, sync_gradients));
  return batch;
}

v1::CommandBatch MakeControlBatch(const StepProgram& commands) {
  v1::CommandBatch batch;
  StepProgramToProto(commands, batch.mutable_control()->mutable_commands());
  return batch;
}

absl::StatusOr<std::string> BatchDigest(const v1::CommandBatch& batch) {
  const absl::string_view kind = BatchKindName(batch.kind_case());
  switch (batch.kind_case()) {
    case v1::CommandBatch::kStep: {
      ASSIGN_OR_RETURN(StepProgram program,
                       StepProgramFromProto(batch.step().commands(), "step.commands"));
      return ProgramDigest(program, batch.step().step(), batch.step().sync_gradients());
    }
    case v1::CommandBatch::kControl: {
      ASSIGN_OR_RETURN(StepProgram program,
                       StepProgramFromProto(batch.control().commands(), "control.commands"));
      return BatchContentDigest(kind, EncodeStepProgram(program));
    }
    case v1::CommandBatch::kCheckpoint:
      if (batch.checkpoint().op_case() == v1::CheckpointBatch::OP_NOT_SET) {
        return absl::InvalidArgumentError(
            "checkpoint.op is not set: a checkpoint batch holds one save_shard, load_shard, "
            "take_peer_snapshot or restore_peer_snapshot");
      }
      return BatchContentDigest(kind, CanonicalBytes(batch.checkpoint()));
    case v1::CommandBatch::kSummon:
      return BatchContentDigest(kind, CanonicalBytes(batch.summon()));
    case v1::CommandBatch::KIND_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      "kind is not set: a command batch is a step, control, checkpoint or summon batch");
}

absl::string_view BatchKindName(v1::CommandBatch::KindCase kind) {
  switch (kind) {
    case v1::CommandBatch::kStep:
      return "step";
    case v1::CommandBatch::kControl:
      return "control";
    case v1::CommandBatch::kCheckpoint:
      return "checkpoint";
    case v1::CommandBatch::kSummon:
      return "summon";
    case v1::CommandBatch::KIND_NOT_SET:
      break;
  }
  return "unset";
}

}  // namespace flatshard
