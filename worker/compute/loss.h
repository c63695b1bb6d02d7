// The training losses and their gradients with respect to the model output,
// both with torch's default reduction='mean': MSELoss averages over every
// element, CrossEntropyLoss over rows. Values are accumulated in double.
#ifndef FLATSHARD_WORKER_COMPUTE_LOSS_H_
#define FLATSHARD_WORKER_COMPUTE_LOSS_H_

#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "worker/compute/tensor.h"

namespace flatshard::compute {

enum class LossKind { kMse, kCrossEntropy };

// "mse", "cross_entropy".
absl::string_view LossKindName(LossKind kind);

// mean((y - t)^2) over all elements of y [N, D]; grad = 2 (y - t) / (N * D).
// INVALID_ARGUMENT when the shapes differ or N * D == 0.
absl::StatusOr<double> MseLoss(const Tensor& outputs, const Tensor& targets, Tensor& grad);

// mean over rows of -log softmax(logits[r])[labels[r]], with the log-sum-exp
// shifted by the row max; grad = (softmax - onehot(label)) / N. INVALID_ARGUMENT
// when labels.size() != N, N == 0, or a label is outside [0, V).
absl::StatusOr<double> CrossEntropyLoss(const Tensor& logits, std::span<const int32_t> labels,
                                        Tensor& grad);

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_LOSS_H_
