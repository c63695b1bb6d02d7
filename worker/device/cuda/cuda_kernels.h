// The CUDA device's kernels as plain launchers over raw device pointers, so the
// stream (cuda_stream*.cc) is ordinary C++ and only the .cu files are CUDA C++.
// Each launcher enqueues its kernels on `stream` and returns the launch error
// (cudaGetLastError), never a later asynchronous one; a launcher with nothing to
// do (zero elements) enqueues nothing and returns cudaSuccess. Shapes were
// validated by the caller (worker/device/stream_checks.h) and each function's
// contract is the Stream operation of the same name (worker/device/stream.h).
//
// Arithmetic: every element goes through the shared bodies of
// worker/device/kernels/element_ops.h, core/optimizer_update.h and
// core/clip_grad_norm_math.h, compiled with --fmad=false so nothing is
// contracted into an FMA the host does not do (docs/architecture.md §5).
// Reductions are deterministic: per-row statistics use cub::BlockReduce, column
// sums add blocks of rows in the order kernels::ColumnSumBlocks fixes for every
// device (the host's order, so they are bit-exact), and whole-tensor sums use a
// fixed grid of kReductionBlocks partials finished by one block, never
// floating-point atomics.
#ifndef FLATSHARD_WORKER_DEVICE_CUDA_CUDA_KERNELS_H_
#define FLATSHARD_WORKER_DEVICE_CUDA_CUDA_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include "core/dtype.h"
#include "core/optimizer_update.h"
#include "worker/device/stream.h"

namespace flatshard::cuda {

// The fixed first-stage grid of the whole-tensor reductions: results do not
// depend on the GPU's size, so they repeat bit for bit from run to run.
inline constexpr size_t kReductionBlocks = 256;

// ---- mixed precision and the gradient path (elementwise_kernels.cu)
// Different floating dtypes only (equal dtypes are a copy, done by the caller).
cudaError_t LaunchCast(DType src_dtype, const void* src, DType dst_dtype, void* dst, size_t count,
                       cudaStream_t stream);
cudaError_t LaunchPrepareGradForReduce(const float* grad, size_t grad_count, DType reduce_dtype,
                                       void* out, size_t out_count, float pre_divide,
                                       cudaStream_t stream);
cudaError_t LaunchAccumulateReducedGrad(DType reduce_dtype, const void* reduced, float* acc,
                                        size_t count, float post_divide, cudaStream_t stream);

// ---- elementwise layer pieces and optimizers (elementwise_kernels.cu)
cudaError_t LaunchActivationForward(Activation kind, const float* x, float* y, size_t count,
                                    cudaStream_t stream);
cudaError_t LaunchActivationBackward(Activation kind, const float* saved, const float* dy,
                                     float* dx, size_t count, cudaStream_t stream);
cudaError_t LaunchAdd(float* acc, const float* x, size_t count, cudaStream_t stream);
// `momentum` is null without momentum, `max_exp_avg_sq` without amsgrad.
cudaError_t LaunchSgdStep(const SgdCoefficients& c, float* params, const float* grads,
                          float* momentum, size_t count, cudaStream_t stream);
cudaError_t LaunchAdamStep(const AdamCoefficients& c, float* params, const float* grads,
                           float* exp_avg, float* exp_avg_sq, float* max_exp_avg_sq, size_t count,
                           cudaStream_t stream);

// ---- row and column layouts (layout_kernels.cu)
cudaError_t LaunchAddBias(float* y, size_t rows, const float* bias, size_t cols,
                          cudaStream_t stream);
// out[c] += the sum down the rows of x (of x * y when y is not null), in the
// order of kernels::ColumnSumBlocks; `partials` holds ColumnSumBlocks(rows) * cols
// floats of scratch.
cudaError_t LaunchColumnSums(const float* x, const float* y, size_t rows, float* out, size_t cols,
                             float* partials, cudaStream_t stream);
cudaError_t LaunchAddRowsModulo(float* x, size_t rows, const float* table, size_t period,
                                size_t cols, cudaStream_t stream);
cudaError_t LaunchSumRowsModulo(const float* x, size_t rows, size_t period, size_t cols, float* out,
                                cudaStream_t stream);
cudaError_t LaunchEmbeddingForward(const int32_t* ids, size_t count, const float* table, size_t dim,
                                   float* out, cudaStream_t stream);
cudaError_t LaunchSplitHeads(const float* rows, const HeadLayout& layout, float* heads,
                             cudaStream_t stream);
cudaError_t LaunchMergeHeads(const float* heads, const HeadLayout& layout, float* rows,
                             cudaStream_t stream);

// ---- EmbeddingBackward (embedding_backward.cu): sorts the ids with their row
// numbers (stable), finds the runs of equal ids and adds each run's rows in row
// order, so table_grad gets exactly the host's sums. `scratch` is device memory
// of at least EmbeddingBackwardScratchBytes(count) bytes, 256-byte aligned, used
// only by the work this call enqueues. `count` must be below 2^31.
cudaError_t EmbeddingBackwardScratchBytes(size_t count, size_t* bytes);
cudaError_t LaunchEmbeddingBackward(const int32_t* ids, size_t count, const float* dout, size_t dim,
                                    float* table_grad, void* scratch, size_t scratch_bytes,
                                    cudaStream_t stream);

// ---- LayerNorm (layer_norm_kernels.cu); weight/bias and the grads may be null.
cudaError_t LaunchLayerNormForward(const float* x, size_t rows, size_t dim, const float* weight,
                                   const float* bias, double eps, float* y, float* xhat,
                                   float* rstd, cudaStream_t stream);
cudaError_t LaunchLayerNormBackward(const float* dy, const float* xhat, const float* rstd,
                                    size_t rows, size_t dim, const float* weight, float* dx,
                                    float* weight_grad, float* bias_grad, float* partials,
                                    cudaStream_t stream);

// ---- softmax and cross-entropy (softmax_kernels.cu)
cudaError_t LaunchCausalSoftmaxForward(const float* scores, size_t matrices, size_t seq,
                                       float scale, float* probs, cudaStream_t stream);
cudaError_t LaunchCausalSoftmaxBackward(const float* probs, const float* dprobs, size_t matrices,
                                        size_t seq, float scale, float* dscores,
                                        cudaStream_t stream);
// `row_losses` is scratch for `rows` doubles.
cudaError_t LaunchCrossEntropyLoss(const float* logits, size_t rows, size_t classes,
                                   const int32_t* labels, float* grad, double* row_losses,
                                   double* loss, cudaStream_t stream);

// ---- whole-tensor reductions (reduction_kernels.cu). `partials` is scratch for
// kReductionBlocks doubles per reduced tensor.
cudaError_t LaunchMseLoss(const float* out, const float* target, size_t count, float* grad,
                          double* partials, double* loss, cudaStream_t stream);
// Writes kReductionBlocks partials of one gradient tensor: sums of |g|^p for
// finite p, NaN-propagating maxima of |g| for p = inf.
cudaError_t LaunchGradNormPartials(const float* grads, size_t count, double norm_type,
                                   double* partials, cudaStream_t stream);
// out[0] = the contribution of `tensors` tensors from their partials, laid out
// one tensor after another (core/clip_grad_norm_math.h).
cudaError_t LaunchGradNormFinish(const double* partials, size_t tensors, double norm_type,
                                 double* out, cudaStream_t stream);
// coef[0] = ClipCoefficient(max_norm, TotalNorm(reduced[0], 0, norm_type)).
cudaError_t LaunchClipCoefficient(const double* reduced, double norm_type, double max_norm,
                                  float* coef, cudaStream_t stream);
// grads[i] *= coef[0].
cudaError_t LaunchScaleGrads(float* grads, size_t count, const float* coef, cudaStream_t stream);

}  // namespace flatshard::cuda

#endif  // FLATSHARD_WORKER_DEVICE_CUDA_CUDA_KERNELS_H_
