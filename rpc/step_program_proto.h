// core's step programs (core/step_program.h) on the wire: the one place that
// converts between StepCommand and flatshard.v1.Command. The coordinator
// converts what it compiled before sending; the worker converts what it
// received before running it, and refuses anything core cannot represent.
#ifndef FLATSHARD_RPC_STEP_PROGRAM_PROTO_H_
#define FLATSHARD_RPC_STEP_PROGRAM_PROTO_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/repeated_ptr_field.h"

#include "core/step_program.h"
#include "flatshard/v1/worker.pb.h"

namespace flatshard {

v1::Command StepCommandToProto(const StepCommand& command);
void StepProgramToProto(const StepProgram& program,
                        google::protobuf::RepeatedPtrField<v1::Command>* commands);

// INVALID_ARGUMENT naming the field, which `field` prefixes
// ("step.commands[2].unshard.unit must be >= 0, got -1"): an op this build
// does not know (unset, or added by a newer flatshard), a negative unit or
// module, clip options that clip_grad_norm refuses.
absl::StatusOr<StepCommand> StepCommandFromProto(const v1::Command& command,
                                                 absl::string_view field);
// `field` names the repeated field ("step.commands"); entries get "[i]".
absl::StatusOr<StepProgram> StepProgramFromProto(
    const google::protobuf::RepeatedPtrField<v1::Command>& commands, absl::string_view field);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_STEP_PROGRAM_PROTO_H_
