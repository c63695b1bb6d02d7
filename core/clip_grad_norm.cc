// docs/fsdp-semantics.md §8: FSDP clip_grad_norm_'s local norms, combination, coefficient and
// scaling. See the header for what is rounded to float32 and why.
#include "core/clip_grad_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"

#include "core/clip_grad_norm_math.h"

namespace flatshard {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

using clip_math::AbsPow;
using clip_math::NaNMax;
using clip_math::Root;
using clip_math::RoundToFloat;

bool IsValidNormType(double norm_type) { return norm_type > 0.0; }  // +inf passes, NaN fails

// torch.linalg.vector_norm(g, p, dtype=float32) for finite p > 0: the sum is in
// double here, the result a float32 value.
double TensorNorm(std::span<const float> grads, double p) {
  double sum = 0.0;
  for (const float g : grads) sum += AbsPow(static_cast<double>(g), p);
  return RoundToFloat(Root(sum, p));
}

}  // namespace

absl::Status ValidateClipGradNormOptions(const ClipGradNormOptions& options) {
  if (!(options.max_norm >= 0.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip_grad_norm.max_norm must be >= 0, got ", options.max_norm));
  }
  if (!IsValidNormType(options.norm_type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip_grad_norm.norm_type must be > 0 or inf, got ", options.norm_type));
  }
  return absl::OkStatus();
}

bool IsInfNorm(double norm_type) { return norm_type == std::numeric_limits<double>::infinity(); }

NormReduceOp NormReduceOpFor(double norm_type) {
  return IsInfNorm(norm_type) ? NormReduceOp::kMax : NormReduceOp::kSum;
}

double LocalGradNormPow(std::span<const float> grads, double norm_type) {
  const std::span<const float> one[] = {grads};
  return LocalGradNormPow(std::span<const std::span<const float>>(one), norm_type);
}

// §8 step 4 then the `local_sharded_norm ** p` of step 5. The stack's norm
// raised to p is the sum of the per-tensor norms raised to p, so the stack norm
// itself is never formed (one float32 rounding fewer than torch).
double LocalGradNormPow(std::span<const std::span<const float>> grads, double norm_type) {
  if (!IsValidNormType(norm_type) || IsInfNorm(norm_type)) return kNaN;
  double sum = 0.0;
  for (const std::span<const float> tensor : grads) {
    sum += AbsPow(TensorNorm(tensor, norm_type), norm_type);
  }
  return RoundToFloat(sum);
}

double LocalGradNormInf(std::span<const float> grads) {
  double max = 0.0;
  for (const float g : grads) max = NaNMax(max, std::fabs(static_cast<double>(g)));
  return max;  // a float32 value already
}

double LocalGradNormInf(std::span<const std::span<const float>> grads) {
  double max = 0.0;
  for (const std::span<const float> tensor : grads) max = NaNMax(max, LocalGradNormInf(tensor));
  return max;
}

double LocalGradNormContribution(std::span<const std::span<const float>> grads, double norm_type) {
  return IsInfNorm(norm_type) ? LocalGradNormInf(grads) : LocalGradNormPow(grads, norm_type);
}

// §8 step 5. For p = inf torch folds the non-sharded max in before the MAX
// all-reduce; max being idempotent, folding it in after gives the same total.
double TotalNormFromReduced(double reduced_sum_pow_or_max, double nonsharded_pow_or_max,
                            double norm_type) {
  if (!IsValidNormType(norm_type)) return kNaN;
  return clip_math::TotalNorm(reduced_sum_pow_or_max, nonsharded_pow_or_max, norm_type);
}

// §8 step 7 on float32 scalars, op by op: `total_norm + 1e-6` (the Python
// scalar becomes float32), `max_norm / t` which Tensor.__rtruediv__ evaluates
// as `t.reciprocal() * max_norm`, then torch.clamp(max=1.0), which keeps NaN.
double ClipCoefficient(double max_norm, double total_norm) {
  return static_cast<double>(clip_math::ClipCoefficient(max_norm, total_norm));
}

void ScaleGrads(std::span<float> grads, double coef) {
  const float factor = static_cast<float>(coef);
  for (float& g : grads) g *= factor;
}

}  // namespace flatshard
