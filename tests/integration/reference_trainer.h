// Single-process, unsharded training: the same model, initial values, data and
// optimizer formulas as an FSDP job, on whole parameters and the global batch.
// FSDP runs are held against it step for step. It computes on the CPU device
// with core's host optimizer, whatever device the runs it checks use.
#ifndef FLATSHARD_TESTS_INTEGRATION_REFERENCE_TRAINER_H_
#define FLATSHARD_TESTS_INTEGRATION_REFERENCE_TRAINER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/model_spec.h"
#include "core/optimizer.h"
#include "worker/compute/batch.h"
#include "worker/compute/dense_param_store.h"
#include "worker/compute/model.h"
#include "worker/device/host/host_device.h"
#include "worker/runtime/fsdp_runtime.h"

namespace flatshard::testing {

class ReferenceTrainer : public compute::ModuleHooks {
 public:
  static absl::StatusOr<std::unique_ptr<ReferenceTrainer>> Create(const ModelSpec& spec,
                                                                  const RuntimeOptions& options);

  // Accumulates gradients over `batches` (each a whole global batch), then takes
  // one optimizer step (with clipping when configured). Returns the mean loss.
  absl::StatusOr<double> Step(const std::vector<compute::Batch>& batches);

  std::map<std::string, std::vector<float>> Params() const;
  // The gradients of the last Step (after clipping), by FQN.
  std::map<std::string, std::vector<float>> Grads() const;
  double last_grad_norm() const { return last_grad_norm_; }

  absl::Status BeforeForward(int) override { return absl::OkStatus(); }
  absl::Status AfterForward(int) override { return absl::OkStatus(); }
  absl::Status BeforeBackward(int) override { return absl::OkStatus(); }
  absl::Status AfterBackward(int) override { return absl::OkStatus(); }

 private:
  ReferenceTrainer(ModelIndex index, RuntimeOptions options)
      : index_(std::move(index)), options_(std::move(options)), store_(index_) {}

  ModelIndex index_;
  RuntimeOptions options_;
  // The reference computes on the CPU device: its parameters are host memory.
  HostDevice device_;
  std::unique_ptr<Stream> stream_;
  compute::DenseParamStore store_;
  std::unique_ptr<compute::Model> model_;
  std::vector<std::unique_ptr<OptimizerState>> states_;  // by param index (primaries)
  double last_grad_norm_ = -1;
};

}  // namespace flatshard::testing

#endif  // FLATSHARD_TESTS_INTEGRATION_REFERENCE_TRAINER_H_
