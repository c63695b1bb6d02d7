// Per-worker accounting of the bytes FSDP keeps, by kind, with peaks: what the
// plan predicts (core/plan.h) and what tests and metrics read back. Updated from
// the compute and communication lanes, so counters are atomic.
#ifndef FLATSHARD_WORKER_DEVICE_MEMORY_TRACKER_H_
#define FLATSHARD_WORKER_DEVICE_MEMORY_TRACKER_H_

#include <array>
#include <atomic>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace flatshard {

enum class MemoryKind : int {
  kShardedParams,      // fp32 master shards
  kOffloadedParams,    // master shards under CPUOffload (pinned host memory on GPUs)
  kLowPrecisionShard,  // transient param_dtype copy for the all-gather
  kUnshardedParams,    // padded all-gather buffers (+ fp32 compute views)
  kGradients,          // unsharded grads during backward, grad shards after
  kOptimizerState,
  kActivations,  // the model's activations and their gradients during a step
  kCount,
};

absl::string_view MemoryKindName(MemoryKind kind);  // "sharded_params", ...

class MemoryTracker {
 public:
  void Add(MemoryKind kind, int64_t bytes);
  void Sub(MemoryKind kind, int64_t bytes);

  int64_t current(MemoryKind kind) const;
  int64_t peak(MemoryKind kind) const;
  void ResetPeaks();

 private:
  struct Counter {
    std::atomic<int64_t> current{0};
    std::atomic<int64_t> peak{0};
  };
  std::array<Counter, static_cast<size_t>(MemoryKind::kCount)> counters_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_MEMORY_TRACKER_H_
