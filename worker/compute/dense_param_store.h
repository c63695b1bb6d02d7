// Whole (unsharded) parameters and grads in host memory behind the
// ParamResolver interface: single-process training, the reference FSDP runs are
// compared against, and the store the compute tests train with. Tied aliases
// resolve to their primary's storage, as in FSDP. Host memory is the CPU
// device's memory, so the store serves models on the CPU device only (the
// simulated device refuses its addresses, as a GPU would).
#ifndef FLATSHARD_WORKER_COMPUTE_DENSE_PARAM_STORE_H_
#define FLATSHARD_WORKER_COMPUTE_DENSE_PARAM_STORE_H_

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"

#include "core/model_spec.h"
#include "worker/compute/param_resolver.h"

namespace flatshard::compute {

class DenseParamStore : public ParamResolver {
 public:
  // Zero values and grads for every primary parameter of `index` (which need
  // not outlive the store).
  explicit DenseParamStore(const ModelIndex& index);

  // InitParam(index, p, seed) for every primary parameter.
  absl::Status Init(const ModelIndex& index, uint64_t seed);

  // The primary's storage; grad is null for frozen parameters; both are null
  // for an index outside the model.
  ParamSlot Resolve(int param_index) override;

  // Views of a parameter's (its primary's) values and grads.
  std::span<float> values(int param_index);
  std::span<float> grads(int param_index);
  bool trainable(int param_index) const;
  int num_params() const { return static_cast<int>(primary_.size()); }

  void ZeroGrads();

 private:
  std::vector<int> primary_;                // param index -> its primary
  std::vector<bool> trainable_;             // by param index
  std::vector<std::vector<float>> values_;  // by param index; empty for aliases
  std::vector<std::vector<float>> grads_;   // same
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_DENSE_PARAM_STORE_H_
