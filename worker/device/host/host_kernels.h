// The kernel set on host memory: plain loops over the shared element bodies
// (worker/device/kernels/element_ops.h) and OpenBLAS for the GEMMs. The CPU device
// runs these on its streams and the simulated device runs the very same functions
// on its stream threads, so what the sim checks is the arithmetic the CPU path
// computes. Pointers are host pointers; shapes were validated by the caller
// (worker/device/host/host_exec_stream.cc). Each function's contract is the
// Stream operation of the same name (worker/device/stream.h).
#ifndef FLATSHARD_WORKER_DEVICE_HOST_HOST_KERNELS_H_
#define FLATSHARD_WORKER_DEVICE_HOST_HOST_KERNELS_H_

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"
#include "worker/device/stream.h"

namespace flatshard::host_kernels {

// GEMM operands as host pointers (GemmArgs' spans resolved).
struct HostGemm {
  const GemmArgs* args = nullptr;
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
};

void Cast(DType src_dtype, const std::byte* src, DType dst_dtype, std::byte* dst, size_t count);
void PrepareGradForReduce(const float* grad, size_t grad_count, DType reduce_dtype, std::byte* out,
                          size_t out_count, double pre_divide);
void AccumulateReducedGrad(DType reduce_dtype, const std::byte* reduced, float* acc, size_t count,
                           double post_divide);

void Gemm(const HostGemm& gemm);
void AddBias(float* y, size_t rows, const float* bias, size_t cols);
void AccumulateColumnSums(const float* x, size_t rows, float* out, size_t cols);
void ActivationForward(Activation kind, const float* x, float* y, size_t count);
void ActivationBackward(Activation kind, const float* saved, const float* dy, float* dx,
                        size_t count);
void Add(float* acc, const float* x, size_t count);
void AddRowsModulo(float* x, size_t rows, const float* table, size_t period, size_t cols);
void SumRowsModulo(const float* x, size_t rows, size_t period, size_t cols, float* out);

void LayerNormForward(const float* x, size_t rows, size_t dim, const float* weight,
                      const float* bias, double eps, float* y, float* xhat, float* rstd);
void LayerNormBackward(const float* dy, const float* xhat, const float* rstd, size_t rows,
                       size_t dim, const float* weight, float* dx, float* weight_grad,
                       float* bias_grad);

void EmbeddingForward(const int32_t* ids, size_t count, const float* table, size_t dim, float* out);
void EmbeddingBackward(const int32_t* ids, size_t count, const float* dout, size_t dim,
                       float* table_grad);

void SplitHeads(const float* rows, const HeadLayout& layout, float* heads);
void MergeHeads(const float* heads, const HeadLayout& layout, float* rows);

void MseLoss(const float* out, const float* target, size_t count, float* grad, double* loss);
// The causal softmax and the cross-entropy loss: host_softmax_kernels.h.

// One tensor's share of clip_grad_norm_'s local contribution: finite p, the sum of
// |g|^p (double); inf, max |g| with NaN propagated.
double GradAbsPowSum(const float* grads, size_t count, double norm_type);
double GradAbsMax(const float* grads, size_t count);
void ScaleGrads(float* grads, size_t count, float coef);

}  // namespace flatshard::host_kernels

#endif  // FLATSHARD_WORKER_DEVICE_HOST_HOST_KERNELS_H_
