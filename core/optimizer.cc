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
// fmaf is used exactly where torch fuses (core/optimizer_update.h), and nothing
// else may be contracted (flatshard builds with -std=c++20, where GCC's default
// is -ffp-contract=off; CUDA kernels build with --fmad=false).
#include "core/optimizer.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/optimizer_update.h"
#include "core/status_macros.h"

namespace flatshard {
namespace {

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
  RETURN_IF_ERROR(CheckSettable(name, values.size()));
  tensors_[*IndexOf(name)].emplace(values.begin(), values.end());
  return absl::OkStatus();
}

absl::Status OptimizerState::SetState(absl::string_view name, std::vector<float>&& values) {
  RETURN_IF_ERROR(CheckSettable(name, values.size()));
  tensors_[*IndexOf(name)] = std::move(values);
  return absl::OkStatus();
}

absl::Status OptimizerState::CheckSettable(absl::string_view name, size_t size) const {
  const std::optional<size_t> index = IndexOf(name);
  if (!index.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(kind_, " optimizer state has no tensor named '",
                                                   name, "'; it keeps ",
                                                   absl::StrJoin(names_, ", ")));
  }
  if (size != size_) {
    return absl::InvalidArgumentError(absl::StrCat(kind_, " optimizer state '", name, "' has ",
                                                   size, " elements but the shard has ", size_));
  }
  return absl::OkStatus();
}

SgdState::SgdState(size_t size) : OptimizerState(size, {std::string(kMomentumBuffer)}, "sgd") {}

AdamState::AdamState(size_t size)
    : OptimizerState(
          size, {std::string(kExpAvg), std::string(kExpAvgSq), std::string(kMaxExpAvgSq)}, "adam") {
}

absl::StatusOr<OptimizerStepPlan> PlanOptimizerStep(
    const OptimizerSettings& settings, const std::function<bool(absl::string_view)>& present,
    float step_before) {
  RETURN_IF_ERROR(ValidateOptimizerSettings(settings));
  OptimizerStepPlan plan;
  // torch: step_t += 1 in float32, so the count stops growing at 2^24.
  plan.step_after = step_before + 1.0f;
  if (settings.kind == OptimizerKind::kSgd) {
    // torch.optim.sgd._single_tensor_sgd, per element:
    //   grad = -grad if maximize
    //   grad = grad.add(param, alpha=weight_decay)             if weight_decay != 0
    //   buf  = grad.clone()                                    first momentum step
    //   buf  = buf.mul_(momentum).add_(grad, alpha=1-dampening) later ones
    //   grad = grad.add(buf, alpha=momentum) if nesterov else buf
    //   param.add_(grad, alpha=-lr)
    const SgdOptions& o = settings.sgd;
    SgdCoefficients& c = plan.sgd;
    c.maximize = o.maximize;
    c.weight_decay = o.weight_decay != 0.0;
    c.weight_decay_value = static_cast<float>(o.weight_decay);
    c.momentum = o.momentum != 0.0;
    c.nesterov = o.nesterov;
    c.momentum_value = static_cast<float>(o.momentum);
    c.one_minus_dampening = static_cast<float>(1.0 - o.dampening);
    c.neg_lr = static_cast<float>(-o.lr);
    if (c.momentum) {
      const std::string buffer(SgdState::kMomentumBuffer);
      c.first_momentum_step = !present(buffer);
      if (c.first_momentum_step) plan.create.push_back(buffer);
      plan.use.push_back(buffer);
    }
    return plan;
  }
  // torch.optim.adam._single_tensor_adam (torch >= 2.6 folds AdamW in as
  // decoupled_weight_decay; adamw._single_tensor_adamw before it is the same
  // arithmetic), per element, after step_t += 1 (core/optimizer_update.h), with,
  // in Python double, step = float(step_t):
  //   bias_correction1 = 1 - beta1**step, bias_correction2 = 1 - beta2**step,
  //   step_size = lr / bias_correction1, bias_correction2_sqrt = bias_correction2**0.5.
  const AdamOptions& o = settings.adam;
  const std::string exp_avg(AdamState::kExpAvg), exp_avg_sq(AdamState::kExpAvgSq),
      max_exp_avg_sq(AdamState::kMaxExpAvgSq);
  // torch's lazy init (`if len(state) == 0`): zeros, max_exp_avg_sq with amsgrad.
  if (!present(exp_avg) && !present(exp_avg_sq) && !present(max_exp_avg_sq)) {
    plan.create = {exp_avg, exp_avg_sq};
    if (o.amsgrad) plan.create.push_back(max_exp_avg_sq);
  } else if (!present(exp_avg) || !present(exp_avg_sq)) {
    return absl::FailedPreconditionError(
        "AdamStep: the adam state needs both exp_avg and exp_avg_sq, but a loaded state lacks one");
  } else if (o.amsgrad && !present(max_exp_avg_sq)) {
    return absl::FailedPreconditionError(
        "AdamStep: optimizer.amsgrad is true but the adam state has no max_exp_avg_sq (it was "
        "created or loaded without amsgrad)");
  }
  plan.use = {exp_avg, exp_avg_sq};
  if (o.amsgrad) plan.use.push_back(max_exp_avg_sq);
  const double step = plan.step_after;  // _get_value(step_t): the float32 count as a double
  const double bias_correction1 = 1.0 - std::pow(o.beta1, step);
  const double bias_correction2 = 1.0 - std::pow(o.beta2, step);
  const double step_size = o.lr / bias_correction1;
  const bool decoupled = settings.kind == OptimizerKind::kAdamW || o.decoupled_weight_decay;
  AdamCoefficients& c = plan.adam;
  c.maximize = o.maximize;
  c.decoupled = decoupled && o.weight_decay != 0.0;
  c.l2 = !decoupled && o.weight_decay != 0.0;
  c.amsgrad = o.amsgrad;
  c.decay_factor = static_cast<float>(1.0 - o.lr * o.weight_decay);
  c.weight_decay = static_cast<float>(o.weight_decay);
  c.lerp_weight = static_cast<float>(1.0 - o.beta1);
  c.beta2 = static_cast<float>(o.beta2);
  c.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  // `** 0.5`, correctly rounded like sqrt
  c.bias_correction2_sqrt = static_cast<float>(std::sqrt(bias_correction2));
  c.eps = static_cast<float>(o.eps);
  c.neg_step_size = static_cast<float>(-step_size);
  return plan;
}

absl::Status OptimizerStep(const OptimizerSettings& settings, std::span<float> params,
                           std::span<const float> grads, OptimizerState& state) {
  const bool sgd = settings.kind == OptimizerKind::kSgd;
  if (sgd != (dynamic_cast<SgdState*>(&state) != nullptr)) {
    return absl::InvalidArgumentError(
        absl::StrCat("OptimizerStep: ", OptimizerKindName(settings.kind), " needs an ",
                     sgd ? "SgdState" : "AdamState"));
  }
  RETURN_IF_ERROR(CheckSizes(sgd ? "SgdStep" : "AdamStep", params, grads, state));
  ASSIGN_OR_RETURN(OptimizerStepPlan plan,
                   PlanOptimizerStep(
                       settings, [&](absl::string_view name) { return state.HasState(name); },
                       static_cast<float>(state.step())));
  for (const std::string& name : plan.create) {
    RETURN_IF_ERROR(state.SetState(name, std::vector<float>(state.size(), 0.0f)));  // zeros_like
  }
  std::vector<std::span<float>> use;
  for (const std::string& name : plan.use) {
    ASSIGN_OR_RETURN(std::span<float> values, state.State(name));
    use.push_back(values);
  }
  state.set_step(plan.step_after);
  float unused = 0.0f;  // the state an update does not keep (no momentum, no amsgrad)
  if (sgd) {
    for (size_t i = 0; i < params.size(); ++i) {
      SgdUpdate(plan.sgd, params[i], grads[i], use.empty() ? unused : use[0][i]);
    }
    return absl::OkStatus();
  }
  for (size_t i = 0; i < params.size(); ++i) {
    AdamUpdate(plan.adam, params[i], grads[i], use[0][i], use[1][i],
               plan.adam.amsgrad ? use[2][i] : unused);
  }
  return absl::OkStatus();
}

absl::Status SgdStep(std::span<float> params, std::span<const float> grads, SgdState& state,
                     const SgdOptions& options) {
  OptimizerSettings settings;
  settings.kind = OptimizerKind::kSgd;
  settings.sgd = options;
  return OptimizerStep(settings, params, grads, state);
}

absl::Status AdamStep(std::span<float> params, std::span<const float> grads, AdamState& state,
                      const AdamOptions& options) {
  OptimizerSettings settings;
  settings.kind = options.decoupled_weight_decay ? OptimizerKind::kAdamW : OptimizerKind::kAdam;
  settings.adam = options;
  return OptimizerStep(settings, params, grads, state);
}

}  // namespace flatshard
