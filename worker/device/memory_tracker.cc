#include "worker/device/memory_tracker.h"

namespace flatshard {

absl::string_view MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kShardedParams:
      return "sharded_params";
    case MemoryKind::kOffloadedParams:
      return "offloaded_params";
    case MemoryKind::kLowPrecisionShard:
      return "low_precision_shard";
    case MemoryKind::kUnshardedParams:
      return "unsharded_params";
    case MemoryKind::kGradients:
      return "gradients";
    case MemoryKind::kOptimizerState:
      return "optimizer_state";
    case MemoryKind::kActivations:
      return "activations";
    case MemoryKind::kCount:
      break;
  }
  return "?";
}

void MemoryTracker::Add(MemoryKind kind, int64_t bytes) {
  Counter& c = counters_[static_cast<size_t>(kind)];
  const int64_t now = c.current.fetch_add(bytes) + bytes;
  int64_t peak = c.peak.load();
  while (now > peak && !c.peak.compare_exchange_weak(peak, now)) {
  }
}

void MemoryTracker::Sub(MemoryKind kind, int64_t bytes) {
  counters_[static_cast<size_t>(kind)].current.fetch_sub(bytes);
}

int64_t MemoryTracker::current(MemoryKind kind) const {
  return counters_[static_cast<size_t>(kind)].current.load();
}

int64_t MemoryTracker::peak(MemoryKind kind) const {
  return counters_[static_cast<size_t>(kind)].peak.load();
}

void MemoryTracker::ResetPeaks() {
  for (Counter& c : counters_) c.peak.store(c.current.load());
}

}  // namespace flatshard
