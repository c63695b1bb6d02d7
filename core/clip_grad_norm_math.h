// The scalar arithmetic of clip_grad_norm_ (docs/fsdp-semantics.md §8), written
// once for the host (core/clip_grad_norm.cc) and the device kernels that reduce
// gradient norms without leaving the device. See core/clip_grad_norm.h for what
// is rounded to float32 and why.
#ifndef FLATSHARD_CORE_CLIP_GRAD_NORM_MATH_H_
#define FLATSHARD_CORE_CLIP_GRAD_NORM_MATH_H_

#include <cmath>

#include "core/host_device.h"

namespace flatshard::clip_math {

// Rounds to float32 as torch's float32 result tensors are; out-of-range values
// become inf, as in torch.
FLATSHARD_HOST_DEVICE inline double RoundToFloat(double value) {
  return static_cast<double>(static_cast<float>(value));
}

// max that propagates NaN, like torch.maximum and the inf-norm reduction.
FLATSHARD_HOST_DEVICE inline double NaNMax(double a, double b) {
  if (a != a) return a;
  if (b != b) return b;
  return a > b ? a : b;
}

// |x|^p with the cheap exact forms for the common p.
FLATSHARD_HOST_DEVICE inline double AbsPow(double x, double p) {
  const double a = fabs(x);
  if (p == 1.0) return a;
  if (p == 2.0) return a * a;
  return pow(a, p);
}

// s^(1/p), the inverse of AbsPow on sums.
FLATSHARD_HOST_DEVICE inline double Root(double s, double p) {
  if (p == 1.0) return s;
  if (p == 2.0) return sqrt(s);
  return pow(s, 1.0 / p);
}

FLATSHARD_HOST_DEVICE inline bool IsInf(double p) { return p > 1.7976931348623157e308; }

// One tensor's contribution to the local sum of §8 step 5 from the sum of its
// elements' |g|^p: its float32 norm, raised to p again (finite p).
FLATSHARD_HOST_DEVICE inline double TensorContribution(double sum_abs_pow, double p) {
  return AbsPow(RoundToFloat(Root(sum_abs_pow, p)), p);
}

// §8 step 5 after the collective (finite p: the p-th root of the sum; inf: the
// max), rounded to float32.
FLATSHARD_HOST_DEVICE inline double TotalNorm(double reduced, double nonsharded, double p) {
  if (IsInf(p)) return RoundToFloat(NaNMax(reduced, nonsharded));
  return RoundToFloat(Root(reduced + nonsharded, p));
}

// §8 step 7 on float32 scalars, op by op: `total_norm + 1e-6` (the Python
// scalar becomes float32), `max_norm / t` which Tensor.__rtruediv__ evaluates
// as `t.reciprocal() * max_norm`, then torch.clamp(max=1.0), which keeps NaN.
FLATSHARD_HOST_DEVICE inline float ClipCoefficient(double max_norm, double total_norm) {
  const float shifted = static_cast<float>(total_norm) + static_cast<float>(1e-6);
  const float reciprocal = 1.0f / shifted;
  const float coef = reciprocal * static_cast<float>(max_norm);
  return coef != coef ? coef : (coef < 1.0f ? coef : 1.0f);
}

}  // namespace flatshard::clip_math

#endif  // FLATSHARD_CORE_CLIP_GRAD_NORM_MATH_H_
