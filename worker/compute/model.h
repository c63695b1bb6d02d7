// The executable model a worker trains: the layer tree built from a ModelSpec,
// run forward to a loss over one local batch and backward into the parameter
// grads, with module hooks around every module for the FSDP runtime. It owns
// activations only, on its DeviceContext; parameters live wherever the
// ParamResolver says. Forward and Backward only issue work on the context's
// stream; the loss is read once that stream has caught up (ReadLoss).
#ifndef FLATSHARD_WORKER_COMPUTE_MODEL_H_
#define FLATSHARD_WORKER_COMPUTE_MODEL_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "core/model_spec.h"
#include "worker/compute/batch.h"
#include "worker/compute/layer.h"
#include "worker/compute/loss.h"
#include "worker/compute/module_hooks.h"
#include "worker/compute/param_resolver.h"
#include "worker/compute/tensor.h"

namespace flatshard::compute {

// Not thread-safe: one ForwardLoss/Backward at a time.
class Model {
 public:
  // Builds the executable layer tree from a validated spec; `index` must be
  // core::IndexModel(spec) (the model copies what it needs; neither has to
  // outlive it). Module types without compute are UNIMPLEMENTED, mismatched
  // shapes between consecutive layers (where knowable) and bad attributes are
  // INVALID_ARGUMENT; both name the module FQN.
  // `device` may be left empty by callers that only query shapes; Forward then
  // fails with FAILED_PRECONDITION.
  static absl::StatusOr<std::unique_ptr<Model>> Create(const ModelSpec& spec,
                                                       const ModelIndex& index, LossKind loss,
                                                       const DeviceContext& device = {});

  // Forward over the local batch (copied to the device), keeping activations for
  // backward, and the mean loss over the batch (MSE: over all output elements;
  // cross-entropy: over rows, i.e. tokens), like torch's default reduction.
  // Token models read batch.ids, others batch.inputs. A bad batch is
  // INVALID_ARGUMENT; a hook's error is returned as is. Hooks fire for every
  // module (see module_hooks.h).
  absl::Status Forward(const Batch& batch, ParamResolver& params, ModuleHooks& hooks);
  // The loss of the last Forward, once the compute stream has run it (after its
  // Synchronize, or an event recorded after the Forward was synchronized).
  absl::StatusOr<double> ReadLoss() const;
  // Forward, then waits for the compute stream and returns the loss.
  absl::StatusOr<double> ForwardLoss(const Batch& batch, ParamResolver& params, ModuleHooks& hooks);

  // Backward of the last successful ForwardLoss: ACCUMULATES d(mean loss)/d(param)
  // into the grads (callers zero them between steps). FAILED_PRECONDITION without
  // a ForwardLoss to go back through; each forward supports one backward.
  absl::Status Backward(ParamResolver& params, ModuleHooks& hooks);

  LossKind loss() const { return loss_; }
  // True when the model reads Batch::ids (its first compute module is an
  // Embedding, or it is a GPT).
  bool takes_token_ids() const { return takes_token_ids_; }
  // Width of Batch::inputs for dense models; -1 for token models.
  int64_t input_features() const { return input_features_; }
  // Rows of the input embedding for token models; 0 otherwise.
  int64_t vocab_size() const { return vocab_size_; }
  // Width of the model output (logits or predictions); -1 if no layer fixes it.
  int64_t output_features() const { return output_features_; }
  // The model output of the last ForwardLoss, [rows, output_features], on the device.
  const Tensor& output() const { return output_; }
  // The same copied to the host (waits for the compute stream).
  absl::StatusOr<std::vector<float>> OutputToHost() const;
  const DeviceContext& device() const { return device_; }

 private:
  Model() = default;

  absl::Status CheckBatch(const Batch& batch) const;
  // Copies the batch's ids, inputs, targets and labels to the device.
  absl::Status Upload(const Batch& batch);

  DeviceContext device_;
  std::unique_ptr<Layer> root_;
  LossKind loss_ = LossKind::kMse;
  bool takes_token_ids_ = false;
  int64_t input_features_ = -1;
  int64_t vocab_size_ = 0;
  int64_t output_features_ = -1;
  Tensor output_;
  Tensor output_grad_;  // d(mean loss)/d(output), computed with the loss
  bool ready_for_backward_ = false;
  // The batch on the device, for the step in flight.
  Tensor inputs_;
  Tensor targets_;
  DeviceBuffer ids_;     // int32 token ids
  DeviceBuffer labels_;  // int32 labels
  TokenIds token_ids_;
  DeviceBuffer loss_value_;  // one double
  PinnedBuffer loss_host_;   // its copy, read after the stream caught up
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_MODEL_H_
