#include "worker/compute/model.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "worker/compute/layer_builder.h"

namespace flatshard::compute {

absl::StatusOr<std::unique_ptr<Model>> Model::Create(const ModelSpec& spec, const ModelIndex& index,
                                                     LossKind loss) {
  ASSIGN_OR_RETURN(LayerTree tree, BuildLayerTree(spec, index));
  std::unique_ptr<Model> model(new Model());
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
    const Tensor& in = batch.inputs;
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

absl::StatusOr<double> Model::ForwardLoss(const Batch& batch, ParamResolver& params,
                                          ModuleHooks& hooks) {
  ready_for_backward_ = false;
  RETURN_IF_ERROR(CheckBatch(batch));
  RunContext ctx;
  ctx.params = &params;
  ctx.hooks = &hooks;
  ctx.seq_len = batch.seq_len;
  ctx.ids = takes_token_ids_ ? &batch.ids : nullptr;
  const Tensor no_inputs;  // token models read ctx.ids instead
  const Tensor& inputs = takes_token_ids_ ? no_inputs : batch.inputs;
  RETURN_IF_ERROR(root_->Forward(inputs, output_, ctx));
  double loss = 0.0;
  if (loss_ == LossKind::kMse) {
    ASSIGN_OR_RETURN(loss, MseLoss(output_, batch.targets, output_grad_));
  } else {
    ASSIGN_OR_RETURN(loss, CrossEntropyLoss(output_, batch.labels, output_grad_));
  }
  ready_for_backward_ = true;
  return loss;
}

absl::Status Model::Backward(ParamResolver& params, ModuleHooks& hooks) {
  if (!ready_for_backward_) {
    return absl::FailedPreconditionError(
        "Model::Backward: no successful ForwardLoss to go back through (each forward allows one "
        "backward)");
  }
  ready_for_backward_ = false;
  RunContext ctx;
  ctx.params = &params;
  ctx.hooks = &hooks;
  Tensor input_grad;  // d(loss)/d(inputs): not needed by training, dropped
  RETURN_IF_ERROR(root_->Backward(output_grad_, input_grad, ctx));
  output_grad_ = Tensor();
  return absl::OkStatus();
}

}  // namespace flatshard::compute
