// One FSDP unit on one rank: the flat parameter's device buffers and the work
// that moves them (docs/fsdp-semantics.md §2–§3). The fp32 master shard (S
// elements) lives for the whole job; the padded all-gather buffer (S*W, param
// dtype) and its fp32 compute view exist only between Gather and Free; the
// unsharded gradient (N, fp32) exists from the first backward touching the unit
// until its reduction, which accumulates into the gradient shard
// (`_saved_grad_shard`).
//
// Compute is float32: with a 16-bit param dtype the shard is cast to it, the
// all-gather moves 16-bit values and they are widened into the compute view, so
// parameters carry exactly the rounding FSDP's would. Gradients are cast to the
// reduce dtype before the reduce-scatter, as FSDP does.
//
// Streams (docs/architecture.md §5): Gather and ReduceGrad issue their casts and
// collectives on the communication stream; everything else runs on the compute
// stream. The unit records an event after its gather; FsdpRuntime makes the
// compute stream wait for it before the parameters are used, makes the
// communication stream wait for the backward before ReduceGrad, and releases
// each buffer on the stream of its last use. The host-side helpers (ReadShard,
// LoadFull, GatherFullPrecision, ...) stage through pinned host memory and
// collect over the host communicator; callers synchronize the streams first.
#ifndef FLATSHARD_WORKER_RUNTIME_FLAT_PARAM_UNIT_H_
#define FLATSHARD_WORKER_RUNTIME_FLAT_PARAM_UNIT_H_

#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "core/flat_param_layout.h"
#include "core/sharding.h"
#include "core/wrap_policy.h"
#include "worker/comm/collectives.h"
#include "worker/comm/communicator.h"
#include "worker/device/device.h"
#include "worker/device/memory_tracker.h"
#include "worker/runtime/staged_floats.h"

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

// Where a unit's buffers live and its work runs, and what it collects over.
struct UnitPlacement {
  Device* device = nullptr;
  Stream* compute = nullptr;
  Stream* comm = nullptr;
  MemoryTracker* memory = nullptr;
  Collectives* shard = nullptr;        // shards the unit (the world for NO_SHARD's all-reduce)
  Collectives* replicate = nullptr;    // the hybrid replica group, null otherwise
  Communicator* host_shard = nullptr;  // the shard group for host memory (summon, checkpoints)
};

class FlatParamUnit {
 public:
  // Allocates the master shard (zeros) on the compute stream.
  static absl::StatusOr<std::unique_ptr<FlatParamUnit>> Create(UnitRuntimeConfig config,
                                                               const UnitPlacement& placement);

  const UnitRuntimeConfig& config() const { return config_; }
  const FlatParamLayout& layout() const { return config_.layout; }
  bool sharded() const { return IsSharded(config_.strategy); }

  // ---- unshard / reshard
  // Issues the all-gather of the padded flat parameter and the fp32 compute view
  // on the communication stream, then records gathered(). NO_SHARD only builds
  // the view (a cast with mixed precision).
  absl::Status Gather();
  const Event& gathered() const { return *gathered_event_; }
  bool has_params() const { return !compute_view_.empty(); }
  // Compute view of the unpadded flat parameter (N floats), between Gather and Free.
  DeviceSpan<float> params() const { return compute_view_; }
  // Releases the gathered buffers (FSDP's _free_storage) on the compute stream,
  // which must have waited for gathered().
  void Free();
  int64_t unsharded_bytes() const;

  // ---- gradients
  // The unsharded gradient (N floats), allocated zeroed on the compute stream on
  // first use and kept across no_sync micro-steps until ReduceGrad.
  absl::StatusOr<DeviceSpan<float>> EnsureGrad();
  DeviceSpan<float> grad() const;
  // Issues pre-divide + pad, reduce-scatter (all-reduce for NO_SHARD), the hybrid
  // all-reduce, post-divide and the accumulation into the grad shard on the
  // communication stream, which must have waited for the backward (and for
  // EnsureGrad's zeroing). Releases the unsharded gradient there.
  absl::Status ReduceGrad();
  bool has_grad_shard() const { return grad_shard_.allocated(); }
  DeviceSpan<float> grad_shard() const { return grad_shard_.span<float>(); }
  // Drops the grad shard on the compute stream (ordered after the reductions).
  void ClearGradShard();

  // The master shard (S floats), on the device.
  DeviceSpan<float> shard() const { return shard_.span<float>(); }

  // ---- host views (compute stream; the streams must be idle)
  absl::StatusOr<std::vector<float>> ReadShard() const;
  // The master shard copied once into pinned host memory by `stream`, which
  // must be ordered after the shard's last update; the copy is only enqueued
  // (the host reads the buffer after an event recorded behind it).
  absl::StatusOr<PinnedBuffer> CopyShardToPinned(Stream& stream) const;
  absl::Status WriteShard(std::span<const float> values);
  // Replaces the master shard with staged values (S floats): the staged block
  // itself on the CPU device, a copy into the shard elsewhere.
  absl::Status ReplaceShard(StagedFloats values);
  // The grad shard's values, or empty when there is none.
  absl::StatusOr<std::vector<float>> ReadGradShard() const;
  // Sets the master shard from the full flat parameter (N elements, fp32).
  absl::Status LoadFull(std::span<const float> flat);
  absl::Status WriteBackFull(std::span<const float> flat) { return LoadFull(flat); }
  // _get_shard: this rank's S elements of a full flat value (N floats).
  absl::Status ShardOf(std::span<const float> flat, std::span<float> shard) const;

  // ---- collected over the host communicator (all ranks of the shard group call)
  // The full-precision flat parameter (unpadded, N floats), for summon.
  absl::Status GatherFullPrecision(std::vector<float>& out) const;
  // The same for any per-element shard state (S floats, e.g. optimizer state).
  absl::Status GatherShardValues(std::span<const float> values, std::vector<float>& out) const;
  // The same for the gradient shard (docs/fsdp-semantics.md §3.6 unshard_grad):
  // empty when no rank has a gradient; a rank without one contributes zeros.
  absl::Status GatherGradFullPrecision(std::vector<float>& out) const;

 private:
  FlatParamUnit(UnitRuntimeConfig config, const UnitPlacement& placement)
      : config_(std::move(config)), p_(placement) {}

  absl::StatusOr<DeviceBuffer> Allocate(size_t bytes, Stream& stream, MemoryKind kind) const;
  // Floats the unsharded gradient buffer holds (see unsharded_grad_).
  size_t GradCapacity() const;
  // `values` copied into pinned host memory (waits for the copy).
  absl::StatusOr<PinnedBuffer> CopyToPinned(DeviceSpan<const float> values, Stream& stream) const;
  absl::StatusOr<std::vector<float>> ReadToHost(DeviceSpan<const float> values) const;

  UnitRuntimeConfig config_;
  UnitPlacement p_;

  DeviceBuffer shard_;         // fp32, S
  DeviceBuffer gathered_;      // param dtype, S*W (sharded; a 16-bit one only until widened)
  DeviceBuffer compute_copy_;  // fp32, N, when the gathered dtype is not fp32
  DeviceSpan<float> compute_view_;
  std::shared_ptr<Event> gathered_event_;
  DeviceBuffer unsharded_grad_;  // fp32: N, or S*W zero-padded when sharded (GradCapacity)
  DeviceBuffer grad_shard_;      // fp32, S
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_FLAT_PARAM_UNIT_H_
