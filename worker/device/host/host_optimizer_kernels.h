// The optimizer steps on host memory: one fused pass over a shard applying
// core/optimizer_update.h's element formulas (torch's single-tensor SGD and
// Adam/AdamW, bit for bit).
//
// These passes are where a CPU step touches the most bytes per element (Adam:
// 4 floats read, 3 written), so they are built to run at memory bandwidth:
// the flags of a step (maximize, weight decay kind, amsgrad, momentum...) are
// template parameters, so each loop is a straight line the compiler
// vectorizes, and on x86-64 CPUs with AVX2 and FMA a copy compiled for them is
// chosen at run time. Vector FMA, sqrt and division round exactly as their
// scalar forms, and the file is compiled without floating-point contraction,
// so every variant computes the same bits (tested).
#ifndef FLATSHARD_WORKER_DEVICE_HOST_HOST_OPTIMIZER_KERNELS_H_
#define FLATSHARD_WORKER_DEVICE_HOST_HOST_OPTIMIZER_KERNELS_H_

#include <cstddef>

#include "core/optimizer_update.h"
#include "worker/device/host/host_isa.h"

namespace flatshard::host_kernels {

// `momentum` is null without momentum.
void SgdStep(const SgdCoefficients& c, float* params, const float* grads, float* momentum,
             size_t count, HostIsa isa = HostIsa::kBest);

// `max_exp_avg_sq` is null without amsgrad.
void AdamStep(const AdamCoefficients& c, float* params, const float* grads, float* exp_avg,
              float* exp_avg_sq, float* max_exp_avg_sq, size_t count, HostIsa isa = HostIsa::kBest);

}  // namespace flatshard::host_kernels

#endif  // FLATSHARD_WORKER_DEVICE_HOST_HOST_OPTIMIZER_KERNELS_H_
