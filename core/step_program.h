// Compiles a training step into its command program (docs/architecture.md §4): which units
// to unshard, prefetch, reshard and reduce, and where, given the module tree, the
// units, the strategy and the prefetch policy (docs/fsdp-semantics.md §2.5, §9.2). The
// coordinator sends the program; every worker compiles it again from the same
// inputs and compares digests, so both sides agree by construction.
//
// The program interleaves markers (Forward/Backward with a module index and
// done=false on entry, true on exit) with the ops that run at that point, in the
// order the model's hooks fire: forward in module pre-order, backward mirrored.
//
// These are core's own types: the wire form (flatshard.v1.Command) is converted
// at the RPC boundary (rpc/step_program_proto.h), never here.
#ifndef FLATSHARD_CORE_STEP_PROGRAM_H_
#define FLATSHARD_CORE_STEP_PROGRAM_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

#include "core/model_spec.h"
#include "core/optimizer.h"
#include "core/sharding.h"
#include "core/wrap_policy.h"

namespace flatshard {

// One command of a step (or control) program. Only the fields of `op` mean
// anything; the factories set exactly those.
struct StepCommand {
  // The numbers are part of the canonical encoding the digest covers.
  enum class Op : uint8_t {
    kForward = 1,       // marker: module, done
    kBackward = 2,      // marker: module, done
    kUnshard = 3,       // unit, prefetch
    kReshard = 4,       // unit
    kReduceGrad = 5,    // unit
    kZeroGrad = 6,      //
    kClipGradNorm = 7,  // max_norm, norm_type
    kOptimStep = 8,     //
    kBarrier = 9,       // control programs only
  };
  Op op = Op::kOptimStep;
  int module = 0;
  int unit = 0;
  bool done = false;
  bool prefetch = false;
  double max_norm = 0.0;
  double norm_type = 2.0;

  static StepCommand Forward(int module, bool done);
  static StepCommand Backward(int module, bool done);
  static StepCommand Unshard(int unit, bool prefetch);
  static StepCommand Reshard(int unit);
  static StepCommand ReduceGrad(int unit);
  static StepCommand ZeroGrad();
  static StepCommand ClipGradNorm(double max_norm, double norm_type);
  static StepCommand OptimStep();
  static StepCommand Barrier();

  bool is_marker() const { return op == Op::kForward || op == Op::kBackward; }
  friend bool operator==(const StepCommand&, const StepCommand&) = default;
};

using StepProgram = std::vector<StepCommand>;

struct StepProgramOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;  // the effective one
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  bool sync_gradients = true;  // false for a no_sync micro-step: no reduction, no step
  double max_grad_norm = 0.0;  // > 0 adds ClipGradNorm before OptimStep
  double grad_norm_type = 2.0;
};

// THE way to get a job's program options: the coordinator and every worker
// call this with the job's settings, so their programs (and digests) agree.
StepProgramOptions StepProgramOptionsFor(const ShardingSettings& sharding,
                                         const OptimizerSettings& optimizer, int world_size,
                                         bool sync_gradients);

// Units are ComputeUnits' output for `index`.
StepProgram CompileStepProgram(const ModelIndex& index, const std::vector<Unit>& units,
                               const StepProgramOptions& options);

// The canonical bytes of a program (little-endian, fixed width per command):
// what digests cover, independent of any wire format.
std::string EncodeStepProgram(const StepProgram& program);

// xxh3-128 (16 bytes) of a batch's kind ("step", "control", ...) and its
// canonical content, so equal bytes of different kinds never share a digest.
std::string BatchContentDigest(absl::string_view kind, absl::string_view content);

// The digest of a step batch: BatchContentDigest("step", ...) over the step,
// the sync flag and EncodeStepProgram(program).
std::string ProgramDigest(const StepProgram& program, int64_t step, bool sync_gradients);

// One line per command, for logs and error messages ("Unshard(3)", "Prefetch(3)").
std::string DescribeCommand(const StepCommand& command);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_STEP_PROGRAM_H_
