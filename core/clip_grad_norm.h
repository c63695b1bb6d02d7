// FSDP's clip_grad_norm_ (docs/fsdp-semantics.md §8) as pure math over gradient spans: each
// worker's local contribution, the combination after the collective, the clip
// coefficient and the scaling. The collective itself (SUM for finite p, MAX for
// p = inf, over the shard group) happens outside core.
//
// A worker clips its sharded gradients in four steps:
//   double local = LocalGradNormPow(shard_grads, p);      // or LocalGradNormInf
//   double reduced = AllReduce(local, NormReduceOpFor(p));  // worker's collective
//   double total = TotalNormFromReduced(reduced, LocalGradNormPow(nonsharded, p), p);
//   for (auto g : grads) ScaleGrads(g, ClipCoefficient(max_norm, total));
// Non-sharded (replicated) gradients are identical on every rank, so their
// contribution joins after the all-reduce, as in §8 step 5.
//
// Precision, versus torch (which works in float32 tensors): every value torch
// materialises as a float32 tensor (each per-tensor norm, the local norm ** p,
// the total norm, the clip coefficient) is rounded to float32 here too, so
// overflow to inf happens where torch's does and the coefficient is torch's
// float32 value. Sums inside one tensor are accumulated in double instead of
// torch's float32 reduction, whose order depends on the vector width and thread
// count; results agree with torch's to float32 rounding and do not depend on how
// the gradient is split into shards.
//
// Pure arithmetic: never touches a device, a thread or a file.
#ifndef FLATSHARD_CORE_CLIP_GRAD_NORM_H_
#define FLATSHARD_CORE_CLIP_GRAD_NORM_H_

#include <span>

#include "absl/status/status.h"

namespace flatshard {

struct ClipGradNormOptions {
  double max_norm = 0.0;   // >= 0
  double norm_type = 2.0;  // p: > 0, or +inf for the max norm
};

// InvalidArgument naming the field: "clip_grad_norm.norm_type must be > 0 or
// inf, got 0"; NaN fails both checks. The functions below assume a validated
// norm_type and return NaN for any other.
absl::Status ValidateClipGradNormOptions(const ClipGradNormOptions& options);

// The all-reduce §8 step 5 runs on the local contribution.
enum class NormReduceOp { kSum, kMax };
bool IsInfNorm(double norm_type);
NormReduceOp NormReduceOpFor(double norm_type);  // kMax for +inf, else kSum

// Finite p: the local contribution sum |g|^p that §8 all-reduces with SUM, as
// torch forms it: vector_norm(stack([vector_norm(g, p, dtype=float32) for g in
// grads]), p) ** p. One span is one tensor (an FSDP flat-parameter shard);
// empty or no spans give 0, as torch's zero scalar does.
double LocalGradNormPow(std::span<const float> grads, double norm_type);
double LocalGradNormPow(std::span<const std::span<const float>> grads, double norm_type);

// p = inf: max |g| over all elements (0 when empty); NaN if any element is NaN,
// as torch's max-norm reduction propagates it.
double LocalGradNormInf(std::span<const float> grads);
double LocalGradNormInf(std::span<const std::span<const float>> grads);

// LocalGradNormInf for p = inf, else LocalGradNormPow: the value to all-reduce
// with NormReduceOpFor(norm_type).
double LocalGradNormContribution(std::span<const std::span<const float>> grads, double norm_type);

// §8 step 5 after the collective: for finite p, (reduced + nonsharded) ** (1/p);
// for inf, max(reduced, nonsharded). `nonsharded` is the (unreduced) contribution
// of the non-sharded gradients, 0 when there are none. Rounded to float32.
double TotalNormFromReduced(double reduced_sum_pow_or_max, double nonsharded_pow_or_max,
                            double norm_type);

// §8 step 7: clamp(max_norm / (total_norm + 1e-6), max=1.0) evaluated as torch
// does on a float32 tensor (`max_norm / t` is `t.reciprocal() * max_norm`).
// A NaN total gives NaN; an infinite one gives 0.
double ClipCoefficient(double max_norm, double total_norm);

// §8 step 7: grad.mul_(coef.to(grad.dtype)): each element times float32(coef).
void ScaleGrads(std::span<float> grads, double coef);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_CLIP_GRAD_NORM_H_
