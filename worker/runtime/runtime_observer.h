// What an FsdpRuntime reports as it runs, for the worker's metrics: each
// communicator's collectives, unshards and reshards, and finished steps.
// Optional (FsdpOptions::observer); the runtime knows nothing of Prometheus.
#ifndef FLATSHARD_WORKER_RUNTIME_RUNTIME_OBSERVER_H_
#define FLATSHARD_WORKER_RUNTIME_RUNTIME_OBSERVER_H_

#include "absl/strings/string_view.h"

#include "worker/comm/collective_observer.h"

namespace flatshard {

struct StepStats;

class RuntimeObserver {
 public:
  virtual ~RuntimeObserver() = default;

  // The observer for one communicator: `group` is "world", "shard",
  // "replicate" or "snapshot". It lives as long as this observer.
  virtual CollectiveObserver* Collectives(absl::string_view group) = 0;
  // An all-gather issued to unshard a unit (prefetches included).
  virtual void OnUnshard() = 0;
  // A unit's unsharded parameters freed.
  virtual void OnReshard() = 0;
  // A step (or no_sync micro-step) finished on this rank in `seconds`.
  virtual void OnStep(const StepStats& stats, double seconds) = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_RUNTIME_RUNTIME_OBSERVER_H_
