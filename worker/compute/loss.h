// The training losses and their gradients with respect to the model output,
// both with torch's default reduction='mean': MSELoss averages over every
// element, CrossEntropyLoss over rows. Values are accumulated in double. Both
// run on the device; the mean loss lands in one double of device memory, so a
// step needs no host round trip until its end.
#ifndef FLATSHARD_WORKER_COMPUTE_LOSS_H_
#define FLATSHARD_WORKER_COMPUTE_LOSS_H_

#include <cstdint>
#include <span>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "worker/compute/tensor.h"

namespace flatshard::compute {

enum class LossKind { kMse, kCrossEntropy };

// "mse", "cross_entropy".
absl::string_view LossKindName(LossKind kind);

// loss[0] = mean((y - t)^2) over all elements of y [N, D]; grad = 2 (y - t) /
// (N * D), allocated here. INVALID_ARGUMENT when the shapes differ or N * D == 0.
absl::Status MseLoss(const DeviceContext& ctx, const Tensor& outputs, const Tensor& targets,
                     Tensor& grad, DeviceSpan<double> loss);

// loss[0] = mean over rows of -log softmax(logits[r])[labels[r]], with the
// log-sum-exp shifted by the row max; grad = (softmax - onehot(label)) / N.
// `labels` are on the device, `host_labels` the same values for validation:
// INVALID_ARGUMENT when there are not N of them, N == 0, or one is outside [0, V).
absl::Status CrossEntropyLoss(const DeviceContext& ctx, const Tensor& logits,
                              DeviceSpan<const int32_t> labels,
                              std::span<const int32_t> host_labels, Tensor& grad,
                              DeviceSpan<double> loss);

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_LOSS_H_
