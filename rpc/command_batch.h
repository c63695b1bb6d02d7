// Command batches (flatshard.v1.CommandBatch) as both daemons build and check
// them: the batch's kind is its `kind` oneof (step, control, checkpoint,
// summon), never re-derived from its commands, and its digest covers the kind
// and its content (docs/control-plane.md). The coordinator's sequencer stamps
// BatchDigest into every batch that does not carry one yet (a step batch gets
// its own from MakeStepBatch); the worker recomputes it before running one.
#ifndef FLATSHARD_RPC_COMMAND_BATCH_H_
#define FLATSHARD_RPC_COMMAND_BATCH_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "google/protobuf/message.h"

#include "core/step_program.h"
#include "flatshard/v1/worker.pb.h"

namespace flatshard {

// Batches without epoch and seq (the sequencer's to stamp).
// A training step: `program` for global batch `step`, its digest stamped
// from `program` itself (ProgramDigest): the coordinator builds one per step,
// and parsing its own program back out of the proto to hash it was a fifth
// of the sequencer's cost per step (bench/RESULTS.md, 2026-11-30).
// Control, checkpoint and summon batches are left to the sequencer to stamp.
// The largest summon chunk: a TensorChunk must stay well inside the 64 MiB
// gRPC message limit every flatshard channel and server sets.
constexpr int64_t kMaxSummonChunkBytes = int64_t{32} << 20;

// Deterministic serialization: the same message gives the same bytes on both
// daemons (fields in number order, no map-order dependence).
std::string CanonicalBytes(const google::protobuf::Message& message);

v1::CommandBatch MakeStepBatch(const StepProgram& program, int64_t step, bool sync_gradients);
// Manual Unshard / Reshard / Barrier outside a step.
v1::CommandBatch MakeControlBatch(const StepProgram& commands);

// The digest of the batch's kind and content: for a step batch exactly
// core's ProgramDigest of its program, step and sync flag. INVALID_ARGUMENT
// naming the field for a batch without a kind, a checkpoint batch without
// an op, or commands core cannot represent (rpc/step_program_proto.h).
absl::StatusOr<std::string> BatchDigest(const v1::CommandBatch& batch);

// "step", "control", "checkpoint", "summon"; "unset" for KIND_NOT_SET.
absl::string_view BatchKindName(v1::CommandBatch::KindCase kind);

}  // namespace flatshard

#endif  // FLATSHARD_RPC_COMMAND_BATCH_H_
