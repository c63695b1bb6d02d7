#include "worker/compute/loss.h"

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard::compute {

absl::string_view LossKindName(LossKind kind) {
  switch (kind) {
    case LossKind::kMse:
      return "mse";
    case LossKind::kCrossEntropy:
      return "cross_entropy";
  }
  return "unknown";
}

absl::Status MseLoss(const DeviceContext& ctx, const Tensor& outputs, const Tensor& targets,
                     Tensor& grad, DeviceSpan<double> loss) {
  if (targets.rows != outputs.rows || targets.cols != outputs.cols) {
    return absl::InvalidArgumentError(absl::StrCat("MSE loss: targets are [", targets.rows, ", ",
                                                   targets.cols, "] but the model output is [",
                                                   outputs.rows, ", ", outputs.cols, "]"));
  }
  if (outputs.empty()) return absl::InvalidArgumentError("MSE loss: the model output is empty");
  ASSIGN_OR_RETURN(grad, NewTensor(ctx, outputs.rows, outputs.cols));
  return ctx.stream->MseLoss(outputs.span(), targets.span(), grad.span(), loss);
}

absl::Status CrossEntropyLoss(const DeviceContext& ctx, const Tensor& logits,
                              DeviceSpan<const int32_t> labels,
                              std::span<const int32_t> host_labels, Tensor& grad,
                              DeviceSpan<double> loss) {
  const int64_t n = logits.rows;
  const int64_t v = logits.cols;
  if (static_cast<int64_t>(host_labels.size()) != n || labels.size() != host_labels.size()) {
    return absl::InvalidArgumentError(absl::StrCat("cross-entropy loss: ", host_labels.size(),
                                                   " labels for ", n, " rows of logits"));
  }
  if (n == 0 || v == 0) {
    return absl::InvalidArgumentError("cross-entropy loss: the logits are empty");
  }
  for (int64_t r = 0; r < n; ++r) {
    const int32_t label = host_labels[static_cast<size_t>(r)];
    if (label < 0 || label >= v) {
      return absl::InvalidArgumentError(absl::StrCat("cross-entropy loss: label ", label,
                                                     " of row ", r, " is outside [0, ", v, ")"));
    }
  }
  ASSIGN_OR_RETURN(grad, NewTensor(ctx, n, v));
  return ctx.stream->CrossEntropyLoss(logits.span(), v, labels, grad.span(), loss);
}

}  // namespace flatshard::compute
