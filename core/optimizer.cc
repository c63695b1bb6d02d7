// torch.optim's single-tensor SGD / Adam / AdamW on one float32 shard.
//
// How each torch op is reproduced element by element. This is what ATen's CPU
// kernels compute in torch 2.x's AVX2/AVX512 builds; the golden tests in
// tests/unit/core/optimizer_test.cc were printed by torch 2.15.0 on CPU.
// - A Python float meeting a float32 tensor is first rounded to float32
//   (TensorIterator casts the wrapped scalar to the common dtype), so every
//   coefficient below is `static_cast<float>(<the Python double expression>)`.
// - `a.add(b, alpha=s)` is ufunc::add's vectorised `fmadd(b, s, a)`: one rounding.
// - `a.lerp_(b, w)` is ATen's lerp (Lerp.h): `a + w*(b-a)` for |w| < 0.5, else
//   `b - (b-a)*(1-w)`, each product-and-sum fused in the vectorised kernel
//   (`fmadd(coeff, b - a, base)` with coeff = w or w - 1).
// - `a.addcmul_(b, c, value=s)` is `a + (s*b)*c` with the last multiply-add fused.
// - `a.addcdiv_(b, c, value=s)` is `a + (s*b)/c`; `mul_` and `/` are single ops.
// - `sqrt` is correctly rounded here (as CUDA's is). torch 2.15's CPU float
//   sqrt is not: it is an ulp off for about one element in five, so Adam's
//   params can differ from torch-on-CPU's in the last bits. SGD's params and
//   Adam's state tensors (without L2 weight decay, which feeds the params back
//   into the grad) match bit for bit. Other devices' kernels may round
//   differently again.
// std::fma is used exactly where torch fuses, and nothing else may be contracted
// (flatshard builds with -std=c++20, where GCC's default is -ffp-contract=off).
#include "core/optimizer.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/status_macros.h"

namespace flatshard {
namespace {

// ATen's lerp (aten/src/ATen/native/Lerp.h, is_lerp_weight_small) with the
// vectorised kernel's fused multiply-add.
inline float TorchLerp(float self, float end, float weight) {
  const float diff = end - self;
  return std::fabs(weight) < 0.5f ? std::fma(weight, diff, self)
                                  : std::fma(weight - 1.0f, diff, end);
}

// torch.maximum: a NaN in either operand is the result.
inline float TorchMaximum(float a, float b) {
  if (std::isnan(a)) return a;
  if (std::isnan(b)) return b;
  return std::max(a, b);
}

absl::Status CheckNonNegative(absl::string_view field, double value) {
  if (!(value >= 0.0)) {  // NaN fails too, as torch's `not 0.0 <= value`
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.", field, " must be >= 0, got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckBeta(absl::string_view field, double value) {
  if (!(value >= 0.0 && value < 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer.", field, " must be in [0, 1), got ", value));
  }
  return absl::OkStatus();
}

absl::Status CheckSizes(absl::string_view what, std::span<float> params,
                        std::span<const float> grads, const OptimizerState& state) {
  if (grads.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": grads has ", grads.size(),
                                                   " elements but params has ", params.size()));
  }
  if (state.size() != params.size()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": state is for a shard of ", state.size(),
                                                   " elements but params has ", params.size()));
  }
  return absl::OkStatus();
}

}  // namespace

// torch.optim.SGD.__init__ checks lr, momentum and weight_decay, and the
// Nesterov condition; dampening is not checked there either.
absl::Status ValidateSgdOptions(const SgdOptions& options) {
  RETURN_IF_ERROR(CheckNonNegative("lr", options.lr));
  RETURN_IF_ERROR(CheckNonNegative("momentum", options.momentum));
  RETURN_IF_ERROR(CheckNonNegative("weight_decay", options.weight_decay));
  if (options.nesterov && (options.momentum <= 0.0 || options.dampening != 0.0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer.nesterov: Nesterov momentum requires a momentum and zero dampening, got "
        "momentum ",
        options.momentum, " and dampening ", options.dampening));
  }
  return absl::OkStatus();
}

// torch.optim.Adam / AdamW.__init__: lr, eps, betas[0], betas[1], weight_decay.
absl::Status ValidateAdamOptions(const AdamOptions& options) {
  RETURN_IF_ERROR(CheckNonNegative("lr", options.lr));
  RETURN_IF_ERROR(CheckNonNegative("eps", options.eps));
  RETURN_IF_ERROR(CheckBeta("beta1", options.beta1));
  RETURN_IF_ERROR(CheckBeta("beta2", options.beta2));
  RETURN_IF_ERROR(CheckNonNegative("weight_decay", options.weight_decay));
  return absl::OkStatus();
}

OptimizerState::OptimizerState(size_t size, std::vector<std::string> names, absl::string_view kind)
    : size_(size), names_(std::move(names)), tensors_(names_.size()), kind_(kind) {}

std::optional<size_t> OptimizerState::IndexOf(absl::string_view name) const {
  for (size_t i = 0; i < names_.size(); ++i) {
    if (names_[i] == name) return i;
  }
  return std::nullopt;
}

std::vector<std::string> OptimizerState::StateNames() const {
  std::vector<std::string> present;
  for (size_t i = 0; i < names_.size(); ++i) {
    if (tensors_[i].has_value()) present.push_back(names_[i]);
  }
  return present;
}

bool OptimizerState::HasState(absl::string_view name) const {
  const std::optional<size_t> index = IndexOf(name);
  return index.has_value() && tensors_[*index].has_value();
}

absl::StatusOr<std::span<float>> OptimizerState::State(absl::string_view name) {
  RETURN_IF_ERROR(std::as_const(*this).State(name).status());
  return std::span<float>(*tensors_[*IndexOf(name)]);
}

absl::StatusOr<std::span<const float>> OptimizerState::State(absl::string_view name) const {
  const std::optional<size_t> index = IndexOf(name);
  if (!index.has_value() || !tensors_[*index].has_value()) {
    const std::vector<std::string> present = StateNames();
    return absl::NotFoundError(absl::StrCat(
        kind_, " optimizer state has no tensor '", name, "'; present: [",
        absl::StrJoin(present, ", "), "]",
        index.has_value() ? ""
                          : absl::StrCat(" (it keeps only ", absl::StrJoin(names_, ", "), ")")));
  }
  return std::span<const float>(*tensors_[*index]);
}

void OptimizerState::Reset() {
  step_ = 0.0f;
  for (auto& tensor : tensors_) tensor.reset();
}

absl::Status OptimizerState::SetState(absl::string_view name, std::span<const float> values) {
  const std::optional<size_t> index = IndexOf(name);
  if (!index.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(kind_, " optimizer state has no tensor named '",
                                                   name, "'; it keeps ",
                                                   absl::StrJoin(names_, ", ")));
  }
  if (values.size() != size_) {
    return absl::InvalidArgumentError(absl::StrCat(kind_, " optimizer state '", name, "' has ",
                                                   values.size(), " elements but the shard has ",
                                                   size_));
  }
  tensors_[*index].emplace(values.begin(), values.end());
  return absl::OkStatus();
}

std::span<float> OptimizerState::GetOrCreate(size_t index) {
  if (!tensors_[index].has_value()) tensors_[index].emplace(size_, 0.0f);  // zeros_like
  return *tensors_[index];
}

std::optional<std::span<float>> OptimizerState::Find(size_t index) {
  if (!tensors_[index].has_value()) return std::nullopt;
  return std::span<float>(*tensors_[index]);
}

SgdState::SgdState(size_t size) : OptimizerState(size, {std::string(kMomentumBuffer)}, "sgd") {}

AdamState::AdamState(size_t size)
    : OptimizerState(
          size, {std::string(kExpAvg), std::string(kExpAvgSq), std::string(kMaxExpAvgSq)}, "adam") {
}

// torch.optim.sgd._single_tensor_sgd, per element:
//   grad = -grad if maximize
//   grad = grad.add(param, alpha=weight_decay)             if weight_decay != 0
//   buf  = grad.clone()                                    first momentum step
//   buf  = buf.mul_(momentum).add_(grad, alpha=1-dampening) later ones
//   grad = grad.add(buf, alpha=momentum) if nesterov else buf
//   param.add_(grad, alpha=-lr)
absl::Status SgdStep(std::span<float> params, std::span<const float> grads, SgdState& state,
                     const SgdOptions& options) {
  RETURN_IF_ERROR(ValidateSgdOptions(options));
  RETURN_IF_ERROR(CheckSizes("SgdStep", params, grads, state));
  state.IncrementStep();

  const bool use_momentum = options.momentum != 0.0;
  const bool first_momentum_step = use_momentum && !state.Has(0);
  const std::span<float> buf = use_momentum ? state.GetOrCreate(0) : std::span<float>();
  const float weight_decay = static_cast<float>(options.weight_decay);
  const float momentum = static_cast<float>(options.momentum);
  const float one_minus_dampening = static_cast<float>(1.0 - options.dampening);
  const float neg_lr = static_cast<float>(-options.lr);

  for (size_t i = 0; i < params.size(); ++i) {
    float grad = options.maximize ? -grads[i] : grads[i];
    if (options.weight_decay != 0.0) grad = std::fma(params[i], weight_decay, grad);
    if (use_momentum) {
      if (first_momentum_step) {
        buf[i] = grad;
      } else {
        const float decayed = buf[i] * momentum;
        buf[i] = std::fma(grad, one_minus_dampening, decayed);
      }
      grad = options.nesterov ? std::fma(buf[i], momentum, grad) : buf[i];
    }
    params[i] = std::fma(grad, neg_lr, params[i]);
  }
  return absl::OkStatus();
}

// torch.optim.adam._single_tensor_adam (torch >= 2.6 folds AdamW in as
// decoupled_weight_decay; adamw._single_tensor_adamw before it is the same
// arithmetic), per element, after step_t += 1:
//   param.mul_(1 - lr*weight_decay)                 AdamW, weight_decay != 0
//   grad = grad.add(param, alpha=weight_decay)      Adam,  weight_decay != 0
//   exp_avg.lerp_(grad, 1 - beta1)
//   exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
//   torch.maximum(max_exp_avg_sq, exp_avg_sq, out=max_exp_avg_sq)   amsgrad
//   denom = (v.sqrt() / bias_correction2_sqrt).add_(eps)   v = max or exp_avg_sq
//   param.addcdiv_(exp_avg, denom, value=-step_size)
// with, in Python double, step = float(step_t):
//   bias_correction1 = 1 - beta1**step, bias_correction2 = 1 - beta2**step,
//   step_size = lr / bias_correction1, bias_correction2_sqrt = bias_correction2**0.5.
absl::Status AdamStep(std::span<float> params, std::span<const float> grads, AdamState& state,
                      const AdamOptions& options) {
  RETURN_IF_ERROR(ValidateAdamOptions(options));
  RETURN_IF_ERROR(CheckSizes("AdamStep", params, grads, state));
  constexpr size_t kExpAvgIndex = 0, kExpAvgSqIndex = 1, kMaxIndex = 2;

  // torch's lazy init (`if len(state) == 0`): zeros, max_exp_avg_sq with amsgrad.
  if (!state.Has(kExpAvgIndex) && !state.Has(kExpAvgSqIndex) && !state.Has(kMaxIndex)) {
    state.GetOrCreate(kExpAvgIndex);
    state.GetOrCreate(kExpAvgSqIndex);
    if (options.amsgrad) state.GetOrCreate(kMaxIndex);
  }
  const std::optional<std::span<float>> exp_avg = state.Find(kExpAvgIndex);
  const std::optional<std::span<float>> exp_avg_sq = state.Find(kExpAvgSqIndex);
  const std::optional<std::span<float>> max_exp_avg_sq = state.Find(kMaxIndex);
  if (!exp_avg.has_value() || !exp_avg_sq.has_value()) {
    return absl::FailedPreconditionError(absl::StrCat("AdamStep: adam state has ",
                                                      absl::StrJoin(state.StateNames(), ", "),
                                                      " but needs both exp_avg and exp_avg_sq"));
  }
  if (options.amsgrad && !max_exp_avg_sq.has_value()) {
    return absl::FailedPreconditionError(
        "AdamStep: optimizer.amsgrad is true but the adam state has no max_exp_avg_sq (it was "
        "created or loaded without amsgrad)");
  }

  state.IncrementStep();
  const double step = state.step();  // _get_value(step_t): the float32 count as a double
  const double bias_correction1 = 1.0 - std::pow(options.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(options.beta2, step);
  const double step_size = options.lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);  // `** 0.5`, correctly
                                                                     // rounded like sqrt

  const bool decoupled = options.decoupled_weight_decay && options.weight_decay != 0.0;
  const bool l2 = !options.decoupled_weight_decay && options.weight_decay != 0.0;
  const float decay_factor = static_cast<float>(1.0 - options.lr * options.weight_decay);
  const float weight_decay = static_cast<float>(options.weight_decay);
  const float lerp_weight = static_cast<float>(1.0 - options.beta1);
  const float beta2 = static_cast<float>(options.beta2);
  const float one_minus_beta2 = static_cast<float>(1.0 - options.beta2);
  const float bias_sqrt = static_cast<float>(bias_correction2_sqrt);
  const float eps = static_cast<float>(options.eps);
  const float neg_step_size = static_cast<float>(-step_size);

  std::span<float> m = *exp_avg;
  std::span<float> v = *exp_avg_sq;
  for (size_t i = 0; i < params.size(); ++i) {
    float grad = options.maximize ? -grads[i] : grads[i];
    if (decoupled) params[i] *= decay_factor;
    if (l2) grad = std::fma(params[i], weight_decay, grad);
    m[i] = TorchLerp(m[i], grad, lerp_weight);
    const float decayed = v[i] * beta2;
    v[i] = std::fma(one_minus_beta2 * grad, grad, decayed);
    float second_moment = v[i];
    if (options.amsgrad) {
      (*max_exp_avg_sq)[i] = TorchMaximum((*max_exp_avg_sq)[i], v[i]);
      second_moment = (*max_exp_avg_sq)[i];
    }
    const float denom = std::sqrt(second_moment) / bias_sqrt + eps;
    params[i] = params[i] + (neg_step_size * m[i]) / denom;
  }
  return absl::OkStatus();
}

}  // namespace flatshard
