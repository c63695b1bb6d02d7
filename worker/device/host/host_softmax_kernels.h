// The two softmaxes over host memory: attention's causal softmax (forward and
// backward) and the softmax cross-entropy loss. Each row's max, exponentials
// and sums; the element formulas are worker/device/kernels/element_ops.h's.
//
// Row sums go in eight interleaved partial sums (interleaved_sum.h), the same
// order in every copy. The portable copy calls glibc's scalar expf / exp per
// element; the AVX2 + FMA copy (chosen at run time) calls glibc's vector
// versions (libmvec: expf in 8 lanes, exp in 4), within a few ulp of the
// scalar ones, as for GELU (host_gelu_kernels.h). On the byte-level GPT these
// rows were 2.3 ms of a 24 ms forward + backward, latency-bound on the
// sequential sums and the scalar exponentials (bench/RESULTS.md).
#ifndef FLATSHARD_WORKER_DEVICE_HOST_HOST_SOFTMAX_KERNELS_H_
#define FLATSHARD_WORKER_DEVICE_HOST_HOST_SOFTMAX_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "worker/device/host/host_isa.h"

namespace flatshard::host_kernels {

// probs[m, t, t2] = softmax over t2 <= t of scores[m, t, :] * scale, shifted
// by the row's max; 0 for t2 > t. `matrices` [seq, seq] matrices.
void CausalSoftmaxForward(const float* scores, size_t matrices, size_t seq, float scale,
                          float* probs, HostIsa isa = HostIsa::kBest);

// dscores = SoftmaxInputGrad(probs, dprobs, Σ_t2 probs * dprobs, scale) on and
// below the diagonal, 0 above it.
void CausalSoftmaxBackward(const float* probs, const float* dprobs, size_t matrices, size_t seq,
                           float scale, float* dscores);

// loss = mean over rows of -log_softmax(logits)[label]; grad = its gradient
// (CrossEntropyGrad). exp(z - max) is taken in double and summed in double.
void CrossEntropyLoss(const float* logits, size_t rows, size_t classes, const int32_t* labels,
                      float* grad, double* loss, HostIsa isa = HostIsa::kBest);

}  // namespace flatshard::host_kernels

#endif  // FLATSHARD_WORKER_DEVICE_HOST_HOST_SOFTMAX_KERNELS_H_
