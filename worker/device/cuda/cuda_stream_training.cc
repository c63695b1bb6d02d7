// CudaStream: losses, optimizer steps and clip_grad_norm_ (docs/fsdp-semantics.md
// §8) without leaving the device. Checks follow
// worker/device/host/host_exec_stream.cc; the reductions' scratch (per-block
// partials, per-row losses, the clip coefficient) comes from the device pool on
// this stream and is released on it once the work is enqueued.
#include <cstdint>

#include "core/status_macros.h"
#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/cuda_stream.h"
#include "worker/device/stream_checks.h"

namespace flatshard::cuda {
namespace {

using stream_checks::Check;

constexpr absl::string_view kLaunch = "kernel launch";

}  // namespace

absl::Status CudaStream::MseLoss(DeviceSpan<const float> out, DeviceSpan<const float> target,
                                 DeviceSpan<float> grad, DeviceSpan<double> loss) {
  RETURN_IF_ERROR(stream_checks::CheckMse(out, target, grad, loss));
  RETURN_IF_ERROR(failure());
  ASSIGN_OR_RETURN(DeviceBuffer partials, Scratch(kReductionBlocks * sizeof(double)));
  return Launched("MseLoss", kLaunch,
                  LaunchMseLoss(out.address(), target.address(), out.size(), grad.address(),
                                partials.span<double>().address(), loss.address(), raw()));
}

absl::Status CudaStream::CrossEntropyLoss(DeviceSpan<const float> logits, int64_t classes,
                                          DeviceSpan<const int32_t> labels, DeviceSpan<float> grad,
                                          DeviceSpan<double> loss) {
  RETURN_IF_ERROR(stream_checks::CheckCrossEntropy(logits, classes, labels, grad, loss));
  RETURN_IF_ERROR(failure());
  const size_t rows = labels.size();
  ASSIGN_OR_RETURN(DeviceBuffer row_losses, Scratch(rows * sizeof(double)));
  return Launched("CrossEntropyLoss", kLaunch,
                  LaunchCrossEntropyLoss(
                      logits.address(), rows, static_cast<size_t>(classes), labels.address(),
                      grad.address(), row_losses.span<double>().address(), loss.address(), raw()));
}

absl::Status CudaStream::SgdStep(const SgdCoefficients& c, DeviceSpan<float> params,
                                 DeviceSpan<const float> grads, DeviceSpan<float> momentum) {
  RETURN_IF_ERROR(Check(grads.size() == params.size() &&
                            (c.momentum ? momentum.size() == params.size() : momentum.empty()),
                        "SgdStep", "params, grads and momentum buffer sizes differ"));
  RETURN_IF_ERROR(failure());
  return Launched("SgdStep", kLaunch,
                  LaunchSgdStep(c, params.address(), grads.address(),
                                c.momentum ? momentum.address() : nullptr, params.size(), raw()));
}

absl::Status CudaStream::AdamStep(const AdamCoefficients& c, DeviceSpan<float> params,
                                  DeviceSpan<const float> grads, DeviceSpan<float> exp_avg,
                                  DeviceSpan<float> exp_avg_sq, DeviceSpan<float> max_exp_avg_sq) {
  const size_t n = params.size();
  RETURN_IF_ERROR(Check(grads.size() == n && exp_avg.size() == n && exp_avg_sq.size() == n &&
                            (c.amsgrad ? max_exp_avg_sq.size() == n : max_exp_avg_sq.empty()),
                        "AdamStep", "params, grads and optimizer state sizes differ"));
  RETURN_IF_ERROR(failure());
  return Launched(
      "AdamStep", kLaunch,
      LaunchAdamStep(c, params.address(), grads.address(), exp_avg.address(), exp_avg_sq.address(),
                     c.amsgrad ? max_exp_avg_sq.address() : nullptr, n, raw()));
}

absl::Status CudaStream::GradNormContribution(std::span<const DeviceSpan<const float>> grads,
                                              double norm_type, DeviceSpan<double> out) {
  RETURN_IF_ERROR(Check(out.size() == 1, "GradNormContribution", "the output holds one double"));
  RETURN_IF_ERROR(failure());
  // kReductionBlocks partials per tensor, then one block combines them tensor by
  // tensor in order (core/clip_grad_norm_math.h's per-tensor rounding).
  const size_t tensors = grads.size();
  ASSIGN_OR_RETURN(DeviceBuffer partials,
                   Scratch((tensors == 0 ? 1 : tensors) * kReductionBlocks * sizeof(double)));
  double* partial = partials.span<double>().address();
  for (size_t t = 0; t < tensors; ++t) {
    RETURN_IF_ERROR(Launched("GradNormContribution", kLaunch,
                             LaunchGradNormPartials(grads[t].address(), grads[t].size(), norm_type,
                                                    partial + t * kReductionBlocks, raw())));
  }
  return Launched("GradNormContribution", kLaunch,
                  LaunchGradNormFinish(partial, tensors, norm_type, out.address(), raw()));
}

absl::Status CudaStream::ClipGrads(std::span<const DeviceSpan<float>> grads,
                                   DeviceSpan<const double> reduced, double norm_type,
                                   double max_norm) {
  RETURN_IF_ERROR(Check(reduced.size() == 1, "ClipGrads", "the reduced norm is one double"));
  RETURN_IF_ERROR(failure());
  // The coefficient stays on the device: no host round trip between the
  // all-reduce and the scaling (§8 step 7 has no host-side branch either).
  ASSIGN_OR_RETURN(DeviceBuffer coef, Scratch(sizeof(float)));
  const float* coefficient = coef.span<float>().address();
  RETURN_IF_ERROR(Launched("ClipGrads", kLaunch,
                           LaunchClipCoefficient(reduced.address(), norm_type, max_norm,
                                                 coef.span<float>().address(), raw())));
  for (const DeviceSpan<float>& g : grads) {
    RETURN_IF_ERROR(Launched("ClipGrads", kLaunch,
                             LaunchScaleGrads(g.address(), g.size(), coefficient, raw())));
  }
  return absl::OkStatus();
}

}  // namespace flatshard::cuda
