// torch.optim's SGD, Adam and AdamW updates applied to one FSDP flat-parameter
// shard (S float32 elements), with the per-shard optimizer state in torch's
// names so checkpoints can save and load it.
//
// The formulas are those of torch 2.x's single-tensor path (`foreach=False`,
// `fused=False`, `differentiable=False`): `_single_tensor_sgd`,
// `_single_tensor_adam` and `_single_tensor_adamw`. Scalar coefficients are
// computed in double as Python computes them, rounded to float32 as ATen does
// when a Python scalar meets a float32 tensor, and applied one ATen op at a time
// in float32 (see optimizer.cc for the per-op detail).
//
// Pure arithmetic: never touches a device, a thread or a file.
#ifndef FLATSHARD_CORE_OPTIMIZER_H_
#define FLATSHARD_CORE_OPTIMIZER_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/optimizer_update.h"

namespace flatshard {

// torch.optim.SGD's hyperparameters (one param group).
struct SgdOptions {
  double lr = 0.0;  // torch.optim.SGD requires it; >= 0
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;      // needs momentum > 0 and dampening == 0
  double weight_decay = 0.0;  // L2: grad += weight_decay * param
  bool maximize = false;
};

// torch.optim.Adam's hyperparameters; `decoupled_weight_decay` makes it
// torch.optim.AdamW (whose own weight_decay default is 1e-2, not 0).
struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;    // betas[0], in [0, 1)
  double beta2 = 0.999;  // betas[1], in [0, 1)
  double eps = 1e-8;
  double weight_decay = 0.0;
  bool amsgrad = false;
  bool maximize = false;
  bool decoupled_weight_decay = false;  // AdamW: param *= 1 - lr * weight_decay
};

// Which torch.optim optimizer a job trains with. SGD with momentum is SGD with
// SgdOptions::momentum != 0 (it keeps one more state tensor), not a kind.
enum class OptimizerKind { kSgd, kAdam, kAdamW };

// "sgd", "adam", "adamw": the job file's `optimizer.kind` and the checkpoint
// manifest's `optimizer`.
absl::string_view OptimizerKindName(OptimizerKind kind);
absl::StatusOr<OptimizerKind> ParseOptimizerKind(absl::string_view name);

// The one description of a job's optimizer: the job config, the plan, the
// runtime and the checkpoint manifest all read it. Only the options of `kind`
// apply (`sgd` for kSgd, `adam` for kAdam/kAdamW; the runtime sets
// decoupled_weight_decay from the kind).
struct OptimizerSettings {
  OptimizerKind kind = OptimizerKind::kAdamW;
  SgdOptions sgd;
  AdamOptions adam;
  double max_grad_norm = 0.0;  // 0: no clipping
  double grad_norm_type = 2.0;
};

// torch's constructor checks, as InvalidArgument naming the field:
// "optimizer.lr must be >= 0, got -0.1". NaN fails every check, as it does in
// torch (`not 0.0 <= lr`).
absl::Status ValidateSgdOptions(const SgdOptions& options);
absl::Status ValidateAdamOptions(const AdamOptions& options);
// The checks of the options `settings.kind` uses.
absl::Status ValidateOptimizerSettings(const OptimizerSettings& settings);

// The state tensors a step keeps per parameter element, in torch's order:
// momentum_buffer for SGD with momentum; exp_avg, exp_avg_sq and, with
// amsgrad, max_exp_avg_sq for Adam/AdamW. Its size is what the plan charges
// per shard element.
std::vector<std::string> OptimizerStateNames(const OptimizerSettings& settings);
int OptimizerStatesPerElement(const OptimizerSettings& settings);

// One shard's optimizer state: torch's `step` counter and the named state
// tensors, each S float32 elements. A tensor is absent until the optimizer
// creates it (torch's lazy state) or a checkpoint loads it.
class OptimizerState {
 public:
  // Polymorphic: runtimes hold states of either kind by base pointer.
  virtual ~OptimizerState() = default;
  OptimizerState(const OptimizerState&) = default;
  OptimizerState& operator=(const OptimizerState&) = default;
  OptimizerState(OptimizerState&&) = default;
  OptimizerState& operator=(OptimizerState&&) = default;

  // Elements S of the shard this state belongs to.
  size_t size() const { return size_; }

  // torch keeps `step` in a float32 tensor and increments it before use, so it
  // counts exactly up to 2^24 and then stops growing; set_step rounds to float32
  // for the same reason.
  double step() const { return static_cast<double>(step_); }
  void set_step(double step) { step_ = static_cast<float>(step); }

  // The names of the tensors present now, in torch's order. `step` is not a
  // tensor here; save it separately with step().
  std::vector<std::string> StateNames() const;
  bool HasState(absl::string_view name) const;

  // A present tensor's elements; NotFound naming what is present otherwise.
  absl::StatusOr<std::span<float>> State(absl::string_view name);
  absl::StatusOr<std::span<const float>> State(absl::string_view name) const;

  // Creates or overwrites a tensor from a checkpoint. InvalidArgument for a name
  // this optimizer does not keep or a size other than S.
  absl::Status SetState(absl::string_view name, std::span<const float> values);
  // The same, taking `values` over without a copy.
  absl::Status SetState(absl::string_view name, std::vector<float>&& values);

  // Back to a fresh optimizer's state (no tensors, step 0), before a checkpoint
  // that may hold fewer states replaces it.
  void Reset();

 protected:
  // `names` are every tensor this optimizer may keep, in torch's order; `kind`
  // names it in messages ("sgd", "adam").
  OptimizerState(size_t size, std::vector<std::string> names, absl::string_view kind);

 private:
  std::optional<size_t> IndexOf(absl::string_view name) const;
  // InvalidArgument unless `name` is a tensor this optimizer keeps and `size` is S.
  absl::Status CheckSettable(absl::string_view name, size_t size) const;

  size_t size_;
  float step_ = 0.0f;
  std::vector<std::string> names_;
  std::vector<std::optional<std::vector<float>>> tensors_;  // parallel to names_
  std::string kind_;
};

// torch.optim.SGD's state: `momentum_buffer`, absent until the first step with
// momentum != 0 (torch then clones the grad into it). torch's SGD keeps no
// step counter; this one counts SgdStep calls for flatshard's own bookkeeping
// and a torch-compatible checkpoint omits it.
class SgdState : public OptimizerState {
 public:
  static constexpr absl::string_view kMomentumBuffer = "momentum_buffer";

  explicit SgdState(size_t size);
};

// torch.optim.Adam / AdamW's state: `exp_avg`, `exp_avg_sq` and, with amsgrad,
// `max_exp_avg_sq`. Empty until the first step creates them zero-filled (torch's
// lazy init), unless a checkpoint loaded them first.
class AdamState : public OptimizerState {
 public:
  static constexpr absl::string_view kExpAvg = "exp_avg";
  static constexpr absl::string_view kExpAvgSq = "exp_avg_sq";
  static constexpr absl::string_view kMaxExpAvgSq = "max_exp_avg_sq";

  explicit AdamState(size_t size);
};

// One torch.optim.SGD step on a shard: params, grads and state all of S
// elements (InvalidArgument otherwise, and for invalid options; nothing is
// modified on error).
absl::Status SgdStep(std::span<float> params, std::span<const float> grads, SgdState& state,
                     const SgdOptions& options);

// One torch.optim.Adam (or AdamW, with decoupled_weight_decay) step on a shard.
// Errors as SgdStep, plus FailedPrecondition when loaded state lacks a tensor
// the step needs (e.g. max_exp_avg_sq with amsgrad, where torch would raise
// KeyError).
absl::Status AdamStep(std::span<float> params, std::span<const float> grads, AdamState& state,
                      const AdamOptions& options);

// A fresh state of S elements for `kind` (SgdState or AdamState).
std::unique_ptr<OptimizerState> MakeOptimizerState(OptimizerKind kind, size_t size);

// What one step of `settings`' optimizer does before its element updates
// (core/optimizer_update.h), for any storage of the state tensors (host vectors
// here, device buffers on workers): the tensors torch's lazy initialisation
// creates (zero-filled), the tensors the update reads and writes in the update's
// order (SGD: momentum_buffer when momentum != 0; Adam: exp_avg, exp_avg_sq
// and, with amsgrad, max_exp_avg_sq), the step count after the step and the
// update's scalars. `present` says whether a state tensor exists now.
// InvalidArgument for invalid options, FailedPrecondition when loaded state
// lacks a tensor the step needs (where torch would raise KeyError).
struct OptimizerStepPlan {
  std::vector<std::string> create;
  std::vector<std::string> use;
  float step_after = 0.0f;
  SgdCoefficients sgd;    // kSgd
  AdamCoefficients adam;  // kAdam, kAdamW
};
absl::StatusOr<OptimizerStepPlan> PlanOptimizerStep(
    const OptimizerSettings& settings, const std::function<bool(absl::string_view)>& present,
    float step_before);

// One step of `settings`' optimizer on host memory: SgdStep, or AdamStep with
// decoupled_weight_decay set for AdamW. `state` must come from
// MakeOptimizerState(settings.kind, ...) (InvalidArgument otherwise).
absl::Status OptimizerStep(const OptimizerSettings& settings, std::span<float> params,
                           std::span<const float> grads, OptimizerState& state);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_OPTIMIZER_H_
