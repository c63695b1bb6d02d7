// The per-element arithmetic of torch.optim's SGD and Adam/AdamW updates, written
// once for the host loops (core/optimizer.cc) and the device kernels (the host,
// simulated and CUDA backends call the same functions), so every device applies
// exactly torch's single-tensor formulas (see core/optimizer.h for their source).
//
// The scalar coefficients are computed on the host, once per step, in double as
// Python does and rounded to float32 as ATen does when a Python scalar meets a
// float32 tensor; the element updates then run one ATen op at a time in float32.
// Explicit fmaf() marks where torch's kernels fuse; nothing else may be
// contracted (the CUDA build compiles with --fmad=false for that reason).
#ifndef FLATSHARD_CORE_OPTIMIZER_UPDATE_H_
#define FLATSHARD_CORE_OPTIMIZER_UPDATE_H_

#include <cmath>

#include "core/host_device.h"

namespace flatshard {

// torch.lerp(self, end, weight) for float32, as ATen's lerp kernel: the two
// formulas meet at weight 0.5 so each end is exact.
FLATSHARD_HOST_DEVICE inline float TorchLerp(float self, float end, float weight) {
  const float diff = end - self;
  return fabsf(weight) < 0.5f ? fmaf(weight, diff, self) : fmaf(weight - 1.0f, diff, end);
}

// torch.maximum: a NaN in either operand is the result. Written as selects,
// not early returns, so a loop over it vectorizes.
FLATSHARD_HOST_DEVICE inline float TorchMaximum(float a, float b) {
  const float larger = a > b ? a : b;
  const float b_or_larger = b != b ? b : larger;
  return a != a ? a : b_or_larger;
}

// torch.optim.SGD's scalars for one step.
struct SgdCoefficients {
  bool maximize = false;
  bool weight_decay = false;  // weight_decay != 0
  float weight_decay_value = 0.0f;
  bool momentum = false;             // momentum != 0
  bool first_momentum_step = false;  // the buffer is created from this grad
  bool nesterov = false;
  float momentum_value = 0.0f;
  float one_minus_dampening = 1.0f;
  float neg_lr = 0.0f;
};

// _single_tensor_sgd for one element:
//   grad = -grad if maximize
//   grad = grad.add(param, alpha=weight_decay)             if weight_decay != 0
//   buf  = grad.clone()                                    first momentum step
//   buf  = buf.mul_(momentum).add_(grad, alpha=1-dampening) later ones
//   grad = grad.add(buf, alpha=momentum) if nesterov else buf
//   param.add_(grad, alpha=-lr)
// `buf` is the element's momentum buffer (without momentum, any float: it is
// neither read nor written).
FLATSHARD_HOST_DEVICE inline void SgdUpdate(const SgdCoefficients& c, float& param, float grad,
                                            float& buf) {
  if (c.maximize) grad = -grad;
  if (c.weight_decay) grad = fmaf(param, c.weight_decay_value, grad);
  if (c.momentum) {
    if (c.first_momentum_step) {
      buf = grad;
    } else {
      const float decayed = buf * c.momentum_value;
      buf = fmaf(grad, c.one_minus_dampening, decayed);
    }
    grad = c.nesterov ? fmaf(buf, c.momentum_value, grad) : buf;
  }
  param = fmaf(grad, c.neg_lr, param);
}

// torch.optim.Adam / AdamW's scalars for one step (after step_t += 1).
struct AdamCoefficients {
  bool maximize = false;
  bool decoupled = false;  // AdamW with weight_decay != 0: param *= decay_factor
  bool l2 = false;         // Adam with weight_decay != 0: grad += weight_decay * param
  bool amsgrad = false;
  float decay_factor = 1.0f;
  float weight_decay = 0.0f;
  float lerp_weight = 0.0f;  // 1 - beta1
  float beta2 = 0.0f;
  float one_minus_beta2 = 0.0f;
  float bias_correction2_sqrt = 1.0f;
  float eps = 0.0f;
  float neg_step_size = 0.0f;  // -lr / bias_correction1
};

// _single_tensor_adam for one element:
//   param.mul_(1 - lr*weight_decay)                 AdamW, weight_decay != 0
//   grad = grad.add(param, alpha=weight_decay)      Adam,  weight_decay != 0
//   exp_avg.lerp_(grad, 1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)   amsgrad
//   denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)   v = max or exp_avg_sq
//   param.addcdiv_(exp_avg, denom, value=-step_size)
// `max_exp_avg_sq` is read and written with amsgrad only (otherwise any float).
FLATSHARD_HOST_DEVICE inline void AdamUpdate(const AdamCoefficients& c, float& param, float grad,
                                             float& exp_avg, float& exp_avg_sq,
                                             float& max_exp_avg_sq) {
  if (c.maximize) grad = -grad;
  if (c.decoupled) param *= c.decay_factor;
  if (c.l2) grad = fmaf(param, c.weight_decay, grad);
  exp_avg = TorchLerp(exp_avg, grad, c.lerp_weight);
  const float decayed = exp_avg_sq * c.beta2;
  exp_avg_sq = fmaf(c.one_minus_beta2 * grad, grad, decayed);
  float second_moment = exp_avg_sq;
  if (c.amsgrad) {
    max_exp_avg_sq = TorchMaximum(max_exp_avg_sq, exp_avg_sq);
    second_moment = max_exp_avg_sq;
  }
  const float denom = sqrtf(second_moment) / c.bias_correction2_sqrt + c.eps;
  param = param + (c.neg_step_size * exp_avg) / denom;
}

}  // namespace flatshard

#endif  // FLATSHARD_CORE_OPTIMIZER_UPDATE_H_
