// Compiles a training step into its command program (DESIGN.md §4): which units
// to unshard, prefetch, reshard and reduce, and where, given the module tree, the
// units, the strategy and the prefetch policy (reference §2.5, §9.2). The
// coordinator sends the program; every worker compiles it again from the same
// inputs and compares digests, so both sides agree by construction.
//
// The program interleaves markers (Forward/Backward with a module index and
// done=false on entry, true on exit) with the ops that run at that point, in the
// order the model's hooks fire: forward in module pre-order, backward mirrored.
#ifndef FLATSHARD_CORE_STEP_PROGRAM_H_
#define FLATSHARD_CORE_STEP_PROGRAM_H_

#include <string>
#include <vector>

#include "core/model_spec.h"
#include "core/sharding.h"
#include "core/wrap_policy.h"
#include "flatshard/v1/worker.pb.h"

namespace flatshard {

enum class BackwardPrefetch { kPre, kPost, kNone };

struct StepProgramOptions {
  ShardingStrategy strategy = ShardingStrategy::kFullShard;  // the effective one
  BackwardPrefetch backward_prefetch = BackwardPrefetch::kPre;
  bool forward_prefetch = false;
  bool sync_gradients = true;  // false for a no_sync micro-step: no reduction, no step
  double max_grad_norm = 0.0;  // > 0 adds ClipGradNorm before OptimStep
  double grad_norm_type = 2.0;
};

// Units are ComputeUnits' output for `index`.
std::vector<v1::Command> CompileStepProgram(const ModelIndex& index, const std::vector<Unit>& units,
                                            const StepProgramOptions& options);

// xxh3-128 of the program (16 bytes): the commands, the step and sync flag.
std::string ProgramDigest(const std::vector<v1::Command>& commands, int64_t step,
                          bool sync_gradients);

// One line per command, for logs and error messages ("Unshard(3, prefetch)").
std::string DescribeCommand(const v1::Command& command);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_STEP_PROGRAM_H_
