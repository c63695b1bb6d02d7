// Tests the wire boundary (rpc/): core's step programs to and from
// flatshard.v1.Command for every op, refusal of malformed commands naming the
// field, command batches' digests (kind and content), and statuses as data.
#include "rpc/step_program_proto.h"

#include <limits>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "google/protobuf/unknown_field_set.h"
#include "rpc/command_batch.h"
#include "rpc/status_proto.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

// One command of every op, with non-default fields where the op has them.
StepProgram EveryOp() {
  return {StepCommand::Forward(3, false),  StepCommand::Forward(3, true),
          StepCommand::Backward(5, false), StepCommand::Backward(5, true),
          StepCommand::Unshard(2, false),  StepCommand::Unshard(4, true),
          StepCommand::Reshard(1),         StepCommand::ReduceGrad(7),
          StepCommand::ZeroGrad(),         StepCommand::ClipGradNorm(0.5, 3.0),
          StepCommand::OptimStep(),        StepCommand::Barrier()};
}

TEST(StepProgramProtoTest, EveryOpRoundTrips) {
  const StepProgram program = EveryOp();
  google::protobuf::RepeatedPtrField<v1::Command> wire;
  StepProgramToProto(program, &wire);
  ASSERT_EQ(wire.size(), static_cast<int>(program.size()));
  EXPECT_EQ(wire[5].unshard().unit(), 4);
  EXPECT_TRUE(wire[5].unshard().prefetch());
  EXPECT_EQ(wire[9].clip_grad_norm().norm_type(), 3.0);
  auto back = StepProgramFromProto(wire, "step.commands");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, program);
  // An infinite norm type (the max norm) is valid.
  auto inf = StepCommandFromProto(
      StepCommandToProto(StepCommand::ClipGradNorm(1.0, std::numeric_limits<double>::infinity())),
      "c");
  ASSERT_TRUE(inf.ok()) << inf.status();
}

TEST(StepProgramProtoTest, RefusesMalformedCommandsNamingTheField) {
  struct Bad {
    v1::Command command;
    const char* message;
  };
  std::vector<Bad> bad(6);
  bad[0].command.mutable_unshard()->set_unit(-1);
  bad[0].message = "step.commands[1].unshard.unit must be >= 0, got -1";
  bad[1].command.mutable_reshard()->set_unit(-2);
  bad[1].message = "step.commands[1].reshard.unit must be >= 0, got -2";
  bad[2].command.mutable_reduce_grad()->set_unit(-3);
  bad[2].message = "step.commands[1].reduce_grad.unit must be >= 0, got -3";
  bad[3].command.mutable_forward()->set_module(-4);
  bad[3].message = "step.commands[1].forward.module must be >= 0, got -4";
  bad[4].command.mutable_clip_grad_norm()->set_max_norm(1.0);  // norm_type 0
  bad[4].message = "step.commands[1].clip_grad_norm.norm_type must be > 0 or inf, got 0";
  bad[5].message = "step.commands[1].op is not set";  // an empty command
  for (const Bad& b : bad) {
    google::protobuf::RepeatedPtrField<v1::Command> wire;
    wire.Add()->mutable_optim_step();
    *wire.Add() = b.command;
    auto program = StepProgramFromProto(wire, "step.commands");
    ASSERT_FALSE(program.ok()) << b.message;
    EXPECT_EQ(program.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(program.status().message()), HasSubstr(b.message));
  }
  v1::Command negative_backward;
  negative_backward.mutable_backward()->set_module(-1);
  EXPECT_THAT(
      std::string(
          StepCommandFromProto(negative_backward, "control.commands[0]").status().message()),
      HasSubstr("control.commands[0].backward.module must be >= 0"));
}

TEST(StepProgramProtoTest, AnOpFromANewerVersionIsRefused) {
  // An op number this build does not know arrives as an unknown field: the
  // oneof is unset, and the command is refused rather than skipped.
  v1::Command newer;
  newer.GetReflection()->MutableUnknownFields(&newer)->AddLengthDelimited(99, "");
  ASSERT_EQ(newer.op_case(), v1::Command::OP_NOT_SET);
  auto command = StepCommandFromProto(newer, "step.commands[0]");
  ASSERT_FALSE(command.ok());
  EXPECT_THAT(std::string(command.status().message()),
              HasSubstr("step.commands[0].op is not set, or is an op this flatshard does not "
                        "know"));
}

TEST(CommandBatchTest, StepDigestIsCoresProgramDigest) {
  const StepProgram program = {StepCommand::Forward(0, false), StepCommand::Unshard(0, false),
                               StepCommand::Forward(0, true), StepCommand::OptimStep()};
  const v1::CommandBatch batch = MakeStepBatch(program, 12, true);
  ASSERT_EQ(batch.kind_case(), v1::CommandBatch::kStep);
  EXPECT_EQ(batch.step().step(), 12);
  auto digest = BatchDigest(batch);
  ASSERT_TRUE(digest.ok()) << digest.status();
  EXPECT_EQ(*digest, ProgramDigest(program, 12, true));
  EXPECT_EQ(digest->size(), 16u);
  // Stamped by MakeStepBatch from the program, without the proto round trip.
  EXPECT_EQ(batch.digest(), *digest);
  EXPECT_NE(MakeStepBatch(program, 13, true).digest(), *digest);
  EXPECT_NE(MakeStepBatch(program, 12, false).digest(), *digest);
}

TEST(CommandBatchTest, DigestCoversTheKindAndItsContent) {
  const StepProgram commands = {StepCommand::Unshard(1, false)};
  const std::string step = *BatchDigest(MakeStepBatch(commands, 0, true));
  const std::string control = *BatchDigest(MakeControlBatch(commands));
  EXPECT_NE(step, control);  // same commands, other kind
  EXPECT_NE(control, *BatchDigest(MakeControlBatch({StepCommand::Unshard(2, false)})));

  v1::CommandBatch summon;
  summon.mutable_summon()->set_chunk_bytes(1024);
  const std::string summon_digest = *BatchDigest(summon);
  summon.mutable_summon()->set_with_grads(true);
  EXPECT_NE(summon_digest, *BatchDigest(summon));

  v1::CommandBatch save;
  save.mutable_checkpoint()->mutable_save_shard()->set_directory("job/a.partial");
  v1::CommandBatch other = save;
  other.mutable_checkpoint()->mutable_save_shard()->set_directory("job/b.partial");
  EXPECT_EQ(*BatchDigest(save), *BatchDigest(save));
  EXPECT_NE(*BatchDigest(save), *BatchDigest(other));
  // Epoch, seq and digest are outside what the digest covers.
  other = save;
  other.set_seq(9);
  other.set_job_epoch(3);
  EXPECT_EQ(*BatchDigest(save), *BatchDigest(other));
}

TEST(CommandBatchTest, RefusesBatchesWithoutAKindOrAnOp) {
  auto unset = BatchDigest(v1::CommandBatch());
  EXPECT_EQ(unset.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(unset.status().message()), HasSubstr("kind is not set"));
  v1::CommandBatch checkpoint;
  checkpoint.mutable_checkpoint();
  auto no_op = BatchDigest(checkpoint);
  EXPECT_EQ(no_op.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(no_op.status().message()), HasSubstr("checkpoint.op is not set"));
  v1::CommandBatch control = MakeControlBatch({StepCommand::Reshard(0)});
  control.mutable_control()->mutable_commands(0)->mutable_reshard()->set_unit(-1);
  EXPECT_THAT(std::string(BatchDigest(control).status().message()),
              HasSubstr("control.commands[0].reshard.unit must be >= 0"));
  EXPECT_EQ(BatchKindName(v1::CommandBatch::KIND_NOT_SET), "unset");
  EXPECT_EQ(BatchKindName(v1::CommandBatch::kCheckpoint), "checkpoint");
}

TEST(StatusProtoTest, RoundTripsCodeAndMessage) {
  EXPECT_TRUE(StatusFromProto(v1::Status()).ok());
  EXPECT_TRUE(StatusFromProto(StatusToProto(absl::OkStatus())).ok());
  const absl::Status error = absl::UnavailableError("cannot create /ckpt/a: read-only");
  EXPECT_EQ(StatusFromProto(StatusToProto(error)), error);
  v1::Status odd;
  odd.set_code(99);
  odd.set_message("from the future");
  const absl::Status unknown = StatusFromProto(odd);
  EXPECT_EQ(unknown.code(), absl::StatusCode::kUnknown);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("status code 99"));
}

}  // namespace
}  // namespace flatshard
