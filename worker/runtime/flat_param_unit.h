// One FSDP unit on one rank: the flat parameter's buffers and the collectives
// that move them (docs/fsdp-semantics.md §2–§3). The fp32 master shard (S elements) lives for
// the whole job; the padded all-gather buffer (S*W, param dtype) and its fp32
// compute view exist only between Gather and Free; the unsharded gradient
// (N, fp32) exists from the first backward touching the unit until its
// reduction, which accumulates into the gradient shard (`_saved_grad_shard`).
//
// CPU compute is float32: with a 16-bit param dtype the shard is cast to it, the
// all-gather moves 16-bit values, and they are widened into the compute view, so
// parameters carry exactly the rounding FSDP's would. Gradients are cast to the
// reduce dtype before the reduce-scatter, as FSDP does.
//
// Threading: Gather and ReduceGrad run on the communication lane; everything
// else on the compute lane, which only touches a buffer after waiting for the
// lane task that produces it (FsdpRuntime enforces this).
#ifndef FLATSHARD_WORKER_RUNTIME_FLAT_PARAM_UNIT_H_
#define FLATSHARD_WORKER_RUNTIME_FLAT_PARAM_UNIT_H_

#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"

#include "core/flat_param_layout.h"
#include "core/sharding.h"
#include "core/wrap_policy.h"
#include "worker/comm/communicator.h"
#include "worker/device/host/host_buffer.h"
#include "worker/device/memory_tracker.h"

namespace flatshard {

struct UnitRuntimeConfig {
  Unit unit;
  FlatParamLayout layout;                                    // over the shard group
  int shard_rank = 0;                                        // position in the shard group
  ShardingStrategy strategy = ShardingStrategy::kFullShard;  // effective
  ResolvedPrecision precision{DType::kFloat32, DType::kFloat32};
  GradientDivideFactors divide;
  bool cpu_offload = false;  // account the master shard as offloaded
};

class FlatParamUnit {
 public:
  // `shard_comm` shards the unit (the world for NO_SHARD's all-reduce);
  // `replicate_comm` is the hybrid replica group, null otherwise.
  FlatParamUnit(UnitRuntimeConfig config, Communicator* shard_comm, Communicator* replicate_comm,
                MemoryTracker* memory);

  const UnitRuntimeConfig& config() const { return config_; }
  const FlatParamLayout& layout() const { return config_.layout; }
  bool sharded() const { return IsSharded(config_.strategy); }

  // Sets the master shard from the full flat parameter (N elements, fp32).
  absl::Status LoadFull(std::span<const float> flat) { return ShardOf(flat, shard()); }

  // All-gathers the padded flat parameter and builds the fp32 compute view
  // (communication lane). For NO_SHARD only builds the view.
  absl::Status Gather();
  bool has_params() const { return compute_view_ != nullptr; }
  // Frees the gathered buffers (FSDP's _free_storage on reshard).
  void Free();
  int64_t unsharded_bytes() const;

  // Compute view of the unpadded flat parameter (N floats), valid between
  // Gather and Free.
  float* params() { return compute_view_; }
  // The unsharded gradient (N floats); allocated zeroed on first use and kept
  // across no_sync micro-steps until ReduceGrad.
  float* EnsureGrad();
  float* grad() { return unsharded_grad_.allocated() ? unsharded_grad_.as<float>() : nullptr; }

  // Pre-divide, reduce-scatter (all-reduce for NO_SHARD), hybrid all-reduce,
  // post-divide, accumulate into the grad shard; frees the unsharded gradient
  // (communication lane).
  absl::Status ReduceGrad();

  // The master shard and its gradient shard (S elements each; the gradient is
  // empty until the first reduction of a step).
  std::span<float> shard() { return {shard_.as<float>(), shard_.count()}; }
  std::span<const float> shard() const { return {shard_.as<float>(), shard_.count()}; }
  bool has_grad_shard() const { return grad_shard_.allocated(); }
  std::span<float> grad_shard() { return {grad_shard_.as<float>(), grad_shard_.count()}; }
  void ClearGradShard() { grad_shard_.Release(); }

  // Gathers the full-precision flat parameter (unpadded, N floats) for summon.
  absl::Status GatherFullPrecision(std::vector<float>& out) {
    return GatherShardValues(shard(), out);
  }
  // The same for any per-element shard state (S floats, e.g. optimizer state):
  // all-gathers it over the shard group and keeps the unpadded N elements.
  absl::Status GatherShardValues(std::span<const float> values, std::vector<float>& out);
  // _get_shard: this rank's S elements of a full flat value (N floats).
  absl::Status ShardOf(std::span<const float> flat, std::span<float> shard) const;
  // The same for the gradient shard (docs/fsdp-semantics.md §3.6 unshard_grad): empty when no
  // rank has a gradient; a rank without one contributes zeros.
  absl::Status GatherGradFullPrecision(std::vector<float>& out);
  // Writes `flat` (N floats) back into this rank's shard (summon writeback).
  absl::Status WriteBackFull(std::span<const float> flat) { return LoadFull(flat); }

 private:
  absl::Status ReduceShardGrad(std::span<float> unsharded);

  UnitRuntimeConfig config_;
  Communicator* shard_comm_;
  Communicator* replicate_comm_;
  MemoryTracker* memory_;

  HostBuffer shard_;         // fp32, S
  HostBuffer gathered_;      // param dtype, S*W (sharded strategies)
  HostBuffer compute_copy_;  // fp32, N, when the gathered dtype is not fp32
  float* compute_view_ = nullptr;
  HostBuffer unsharded_grad_;  // fp32, N
  HostBuffer grad_shard_;      // fp32, S
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_FLAT_PARAM_UNIT_H_
