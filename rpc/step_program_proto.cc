#include "rpc/step_program_proto.h"

#include "absl/strings/str_cat.h"

#include "core/clip_grad_norm.h"
#include "core/status_macros.h"

namespace flatshard {
namespace {

absl::Status NonNegative(absl::string_view field, absl::string_view name, int value) {
  if (value >= 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(field, ".", name, " must be >= 0, got ", value));
}

}  // namespace

v1::Command StepCommandToProto(const StepCommand& c) {
  v1::Command proto;
  switch (c.op) {
    case StepCommand::Op::kForward:
      proto.mutable_forward()->set_module(c.module);
      proto.mutable_forward()->set_done(c.done);
      break;
    case StepCommand::Op::kBackward:
      proto.mutable_backward()->set_module(c.module);
      proto.mutable_backward()->set_done(c.done);
      break;
    case StepCommand::Op::kUnshard:
      proto.mutable_unshard()->set_unit(c.unit);
      proto.mutable_unshard()->set_prefetch(c.prefetch);
      break;
    case StepCommand::Op::kReshard:
      proto.mutable_reshard()->set_unit(c.unit);
      break;
    case StepCommand::Op::kReduceGrad:
      proto.mutable_reduce_grad()->set_unit(c.unit);
      break;
    case StepCommand::Op::kZeroGrad:
      proto.mutable_zero_grad();
      break;
    case StepCommand::Op::kClipGradNorm:
      proto.mutable_clip_grad_norm()->set_max_norm(c.max_norm);
      proto.mutable_clip_grad_norm()->set_norm_type(c.norm_type);
      break;
    case StepCommand::Op::kOptimStep:
      proto.mutable_optim_step();
      break;
    case StepCommand::Op::kBarrier:
      proto.mutable_barrier();
      break;
  }
  return proto;
}

void StepProgramToProto(const StepProgram& program,
                        google::protobuf::RepeatedPtrField<v1::Command>* commands) {
  commands->Clear();
  commands->Reserve(static_cast<int>(program.size()));
  for (const StepCommand& command : program) *commands->Add() = StepCommandToProto(command);
}

absl::StatusOr<StepCommand> StepCommandFromProto(const v1::Command& c, absl::string_view field) {
  switch (c.op_case()) {
    case v1::Command::kForward:
      RETURN_IF_ERROR(NonNegative(field, "forward.module", c.forward().module()));
      return StepCommand::Forward(c.forward().module(), c.forward().done());
    case v1::Command::kBackward:
      RETURN_IF_ERROR(NonNegative(field, "backward.module", c.backward().module()));
      return StepCommand::Backward(c.backward().module(), c.backward().done());
    case v1::Command::kUnshard:
      RETURN_IF_ERROR(NonNegative(field, "unshard.unit", c.unshard().unit()));
      return StepCommand::Unshard(c.unshard().unit(), c.unshard().prefetch());
    case v1::Command::kReshard:
      RETURN_IF_ERROR(NonNegative(field, "reshard.unit", c.reshard().unit()));
      return StepCommand::Reshard(c.reshard().unit());
    case v1::Command::kReduceGrad:
      RETURN_IF_ERROR(NonNegative(field, "reduce_grad.unit", c.reduce_grad().unit()));
      return StepCommand::ReduceGrad(c.reduce_grad().unit());
    case v1::Command::kZeroGrad:
      return StepCommand::ZeroGrad();
    case v1::Command::kClipGradNorm: {
      // clip_grad_norm's own checks; its messages already name
      // "clip_grad_norm.<option>".
      const absl::Status valid = ValidateClipGradNormOptions(
          {c.clip_grad_norm().max_norm(), c.clip_grad_norm().norm_type()});
      if (!valid.ok()) {
        return absl::InvalidArgumentError(absl::StrCat(field, ".", valid.message()));
      }
      return StepCommand::ClipGradNorm(c.clip_grad_norm().max_norm(),
                                       c.clip_grad_norm().norm_type());
    }
    case v1::Command::kOptimStep:
      return StepCommand::OptimStep();
    case v1::Command::kBarrier:
      return StepCommand::Barrier();
    case v1::Command::OP_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      field, ".op is not set, or is an op this flatshard does not know (a newer version's)"));
}

absl::StatusOr<StepProgram> StepProgramFromProto(
    const google::protobuf::RepeatedPtrField<v1::Command>& commands, absl::string_view field) {
  StepProgram program;
  program.reserve(static_cast<size_t>(commands.size()));
  for (int i = 0; i < commands.size(); ++i) {
    ASSIGN_OR_RETURN(StepCommand command,
                     StepCommandFromProto(commands[i], absl::StrCat(field, "[", i, "]")));
    program.push_back(command);
  }
  return program;
}

}  // namespace flatshard
