#include "worker/compute/dense_param_store.h"

#include <algorithm>

#include "core/status_macros.h"
#include "worker/compute/param_init.h"

namespace flatshard::compute {

DenseParamStore::DenseParamStore(const ModelIndex& index) {
  const size_t n = index.params.size();
  primary_.resize(n);
  trainable_.resize(n);
  values_.resize(n);
  grads_.resize(n);
  for (size_t p = 0; p < n; ++p) {
    const IndexedParam& param = index.params[p];
    primary_[p] = param.primary;
    trainable_[p] = param.spec->requires_grad;
    if (param.primary == static_cast<int>(p)) {
      const auto numel = static_cast<size_t>(NumElements(param.spec->shape));
      values_[p].assign(numel, 0.0f);
      grads_[p].assign(numel, 0.0f);
    }
  }
}

absl::Status DenseParamStore::Init(const ModelIndex& index, uint64_t seed) {
  for (size_t p = 0; p < values_.size(); ++p) {
    if (primary_[p] != static_cast<int>(p)) continue;
    RETURN_IF_ERROR(InitParam(index, static_cast<int>(p), seed, values_[p]));
  }
  return absl::OkStatus();
}

ParamSlot DenseParamStore::Resolve(int param_index) {
  if (param_index < 0 || param_index >= num_params()) return {};
  const auto p = static_cast<size_t>(primary_[static_cast<size_t>(param_index)]);
  // Host memory is the CPU device's memory (worker/device/host/host_device.h).
  ParamSlot slot;
  slot.value = DeviceSpan<float>(values_[p].data(), values_[p].size());
  if (trainable_[p]) slot.grad = DeviceSpan<float>(grads_[p].data(), grads_[p].size());
  return slot;
}

std::span<float> DenseParamStore::values(int param_index) {
  return values_[static_cast<size_t>(primary_[static_cast<size_t>(param_index)])];
}

std::span<float> DenseParamStore::grads(int param_index) {
  return grads_[static_cast<size_t>(primary_[static_cast<size_t>(param_index)])];
}

bool DenseParamStore::trainable(int param_index) const {
  return trainable_[static_cast<size_t>(param_index)];
}

void DenseParamStore::ZeroGrads() {
  for (std::vector<float>& g : grads_) std::fill(g.begin(), g.end(), 0.0f);
}

}  // namespace flatshard::compute
