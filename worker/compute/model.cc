#include "worker/compute/model.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "worker/compute/layer_builder.h"

namespace flatshard::compute {

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelSpec& spec, const ModelIndex& index,
                                                     LossKind loss, const DeviceContext& device) {
  ASSIGN_OR_RETURN(LayerTree tree, BuildLayerTree(spec, index));
  std::unique_ptr<Model> model(new Model());
  model->device_ = device;
  model->root_ = std::move(tree.root);
  model->loss_ = loss;
  model->takes_token_ids_ = tree.takes_token_ids;
  model->input_features_ = tree.input_features;
  model->vocab_size_ = tree.vocab_size;
  model->output_features_ = tree.output_features;
  return model;
}

absl::Status Model::CheckBatch(const Batch& batch) const {
  if (batch.batch_size <= 0 || batch.seq_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("batch: batch_size (", batch.batch_size,
                                                   ") and seq_len (", batch.seq_len,
                                                   ") must be > 0"));
  }
  const int64_t rows = batch.batch_size * batch.seq_len;
  if (takes_token_ids_) {
    if (static_cast<int64_t>(batch.ids.size()) != rows) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: the model takes token ids and needs batch_size * seq_len = ", rows,
                       " of them, got ", batch.ids.size()));
    }
  } else {
    const HostMatrix& in = batch.inputs;
    if (in.rows != rows || static_cast<int64_t>(in.values.size()) != in.rows * in.cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("batch: inputs are [", in.rows, ", ", in.cols, "] with ", in.values.size(),
                       " values; the model needs ", rows, " rows of dense inputs"));
    }
    if (input_features_ >= 0 && in.cols != input_features_) {
      return absl::InvalidArgumentError(absl::StrCat(
          "batch: inputs have ", in.cols, " features, the model takes ", input_features_));
    }
  }
  return absl::OkStatus();
}

absl::Status Model::Upload(const Batch& batch) {
  Stream& stream = *device_.stream;
  auto upload_ints = [&](const std::vector<int32_t>& host, DeviceBuffer& buffer) -> absl::Status {
    ASSIGN_OR_RETURN(buffer, device_.device->Allocate(host.size() * sizeof(int32_t), stream,
                                                      MemoryKind::kActivations, device_.memory));
    return stream.CopyToDevice(buffer.byte_span(), std::as_bytes(std::span<const int32_t>(host)));
  };
  if (takes_token_ids_) {
    RETURN_IF_ERROR(upload_ints(batch.ids, ids_));
    token_ids_ = TokenIds{ids_.span<const int32_t>().first(batch.ids.size()), batch.ids};
  } else {
    ASSIGN_OR_RETURN(inputs_, TensorFromHost(device_, batch.inputs.rows, batch.inputs.cols,
                                             batch.inputs.values));
  }
  if (loss_ == LossKind::kMse) {
    ASSIGN_OR_RETURN(targets_, TensorFromHost(device_, batch.targets.rows, batch.targets.cols,
                                              batch.targets.values));
  } else {
    RETURN_IF_ERROR(upload_ints(batch.labels, labels_));
  }
  return absl::OkStatus();
}

absl::Status Model::Forward(const Batch& batch, ParamResolver& params, ModuleHooks& hooks) {
  ready_for_backward_ = false;
  if (device_.device == nullptr || device_.stream == nullptr) {
    return absl::FailedPreconditionError("Model::Forward: the model was created without a device");
  }
  RETURN_IF_ERROR(CheckBatch(batch));
  RETURN_IF_ERROR(Upload(batch));
  RunContext ctx;
  ctx.device = device_;
  ctx.params = &params;
  ctx.hooks = &hooks;
  ctx.seq_len = batch.seq_len;
  ctx.ids = takes_token_ids_ ? &token_ids_ : nullptr;
  const Tensor no_inputs;  // token models read ctx.ids instead
  RETURN_IF_ERROR(root_->Forward(takes_token_ids_ ? no_inputs : inputs_, output_, ctx));
  if (!loss_value_.allocated()) {
    ASSIGN_OR_RETURN(loss_value_, device_.device->Allocate(sizeof(double), *device_.stream,
                                                           MemoryKind::kActivations, nullptr));
    ASSIGN_OR_RETURN(loss_host_, device_.device->AllocatePinned(sizeof(double)));
  }
  const DeviceSpan<double> loss = loss_value_.span<double>();
  if (loss_ == LossKind::kMse) {
    RETURN_IF_ERROR(MseLoss(device_, output_, targets_, output_grad_, loss));
  } else {
    RETURN_IF_ERROR(CrossEntropyLoss(device_, output_,
                                     labels_.span<const int32_t>().first(batch.labels.size()),
                                     batch.labels, output_grad_, loss));
  }
  RETURN_IF_ERROR(device_.stream->CopyToHost(loss_host_.copy_target(), AsBytes(loss)));
  // The batch is consumed: activations saved by the layers are what backward needs.
  inputs_ = Tensor();
  targets_ = Tensor();
  ids_.Release();
  labels_.Release();
  ready_for_backward_ = true;
  return absl::OkStatus();
}

absl::StatusOr<double> Model::ReadLoss() const {
  if (!loss_host_.allocated()) {
    return absl::FailedPreconditionError("Model::ReadLoss: no forward has run");
  }
  ASSIGN_OR_RETURN(std::span<const double> value, loss_host_.Read<double>());
  return value[0];
}

absl::StatusOr<double> Model::ForwardLoss(const Batch& batch, ParamResolver& params,
                                          ModuleHooks& hooks) {
  RETURN_IF_ERROR(Forward(batch, params, hooks));
  RETURN_IF_ERROR(device_.stream->Synchronize());
  return ReadLoss();
}

absl::StatusOr<std::vector<float>> Model::OutputToHost() const {
  return TensorToHost(device_, output_);
}

absl::Status Model::Backward(ParamResolver& params, ModuleHooks& hooks) {
  if (!ready_for_backward_) {
    return absl::FailedPreconditionError(
        "Model::Backward: no successful ForwardLoss to go back through (each forward allows one "
        "backward)");
  }
  ready_for_backward_ = false;
  RunContext ctx;
  ctx.device = device_;
  ctx.params = &params;
  ctx.hooks = &hooks;
  Tensor input_grad;  // d(loss)/d(inputs): not needed by training, dropped
  RETURN_IF_ERROR(root_->Backward(output_grad_, input_grad, ctx));
  output_grad_ = Tensor();
  return absl::OkStatus();
}

}  // namespace flatshard::compute
