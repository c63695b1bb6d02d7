// How layers find their parameters: by ModelIndex parameter index, through a
// resolver the FSDP runtime implements over its unsharded flat buffers. Layers
// never own or cache parameter storage, because FSDP frees it after forward and
// re-gathers it into a new buffer before backward (docs/fsdp-semantics.md §2.3-2.4).
#ifndef FLATSHARD_WORKER_COMPUTE_PARAM_RESOLVER_H_
#define FLATSHARD_WORKER_COMPUTE_PARAM_RESOLVER_H_

#include "worker/device/device_span.h"

namespace flatshard::compute {

struct ParamSlot {
  DeviceSpan<float> value;  // numel elements, row-major in the param's shape
  DeviceSpan<float> grad;   // backward ACCUMULATES (+=) into it; empty when frozen
};

// Maps ModelIndex param indices to current storage. Storage moves between
// forward and backward (FSDP re-gathers into a new buffer), so layers call
// Resolve again in Backward and never cache pointers. Tied params: the resolver
// returns the primary's storage for aliases, so both uses accumulate into one grad.
class ParamResolver {
 public:
  virtual ~ParamResolver() = default;
  // Called only between the owning module's BeforeForward/AfterForward (or
  // BeforeBackward/AfterBackward) hooks, on the thread issuing the model's work.
  // An empty `value` is reported as an error naming the parameter (its unit was
  // probably not unsharded). The spans are memory of the model's device.
  virtual ParamSlot Resolve(int param_index) = 0;
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_PARAM_RESOLVER_H_
