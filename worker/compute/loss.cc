#include "worker/compute/loss.h"

#include <cmath>

#include "absl/strings/str_cat.h"

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

absl::StatusOr<double> MseLoss(const Tensor& outputs, const Tensor& targets, Tensor& grad) {
  if (targets.rows != outputs.rows || targets.cols != outputs.cols ||
      targets.values.size() != outputs.values.size()) {
    return absl::InvalidArgumentError(absl::StrCat("MSE loss: targets are [", targets.rows, ", ",
                                                   targets.cols, "] but the model output is [",
                                                   outputs.rows, ", ", outputs.cols, "]"));
  }
  if (outputs.values.empty()) {
    return absl::InvalidArgumentError("MSE loss: the model output is empty");
  }
  const auto count = static_cast<double>(outputs.values.size());
  ResizeZero(grad, outputs.rows, outputs.cols);
  double sum = 0.0;
  for (size_t i = 0; i < outputs.values.size(); ++i) {
    const double diff = double{outputs.values[i]} - double{targets.values[i]};
    sum += diff * diff;
    grad.values[i] = static_cast<float>(2.0 * diff / count);
  }
  return sum / count;
}

absl::StatusOr<double> CrossEntropyLoss(const Tensor& logits, std::span<const int32_t> labels,
                                        Tensor& grad) {
  const int64_t n = logits.rows;
  const int64_t v = logits.cols;
  if (static_cast<int64_t>(labels.size()) != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("cross-entropy loss: ", labels.size(), " labels for ", n, " rows of logits"));
  }
  if (n == 0 || v == 0) {
    return absl::InvalidArgumentError("cross-entropy loss: the logits are empty");
  }
  ResizeZero(grad, n, v);
  double total = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    const int32_t label = labels[static_cast<size_t>(r)];
    if (label < 0 || label >= v) {
      return absl::InvalidArgumentError(absl::StrCat("cross-entropy loss: label ", label,
                                                     " of row ", r, " is outside [0, ", v, ")"));
    }
    const float* z = logits.Row(r);
    // log_softmax(z)[k] = z[k] - max - log(sum_j exp(z[j] - max))
    float max = z[0];
    for (int64_t k = 1; k < v; ++k) max = z[k] > max ? z[k] : max;
    float* g = grad.Row(r);
    double sum = 0.0;
    for (int64_t k = 0; k < v; ++k) {
      const double e = std::exp(double{z[k]} - max);
      g[k] = static_cast<float>(e);  // unnormalised softmax, normalised below
      sum += e;
    }
    total += std::log(sum) - (double{z[label]} - max);
    // d(mean loss)/dz[k] = (softmax[k] - [k == label]) / N
    const double inv_n = 1.0 / static_cast<double>(n);
    for (int64_t k = 0; k < v; ++k) {
      g[k] = static_cast<float>((g[k] / sum - (k == label ? 1.0 : 0.0)) * inv_n);
    }
  }
  return total / static_cast<double>(n);
}

}  // namespace flatshard::compute
