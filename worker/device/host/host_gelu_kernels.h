// GELU with approximate='tanh' over host memory, forward and backward: the
// element formulas of worker/device/kernels/element_ops.h (GeluTanh,
// GeluTanhGrad), whose one transcendental is an expf. The portable copy calls
// glibc's scalar expf per element; the AVX2 + FMA copy (chosen at run time)
// calls glibc's vector expf (libmvec, 8 lanes), which was 2.6x faster on the
// byte-level GPT's shapes and where GELU was 22 % of a forward + backward
// (bench/RESULTS.md "Compute"). libmvec's expf is not always the scalar
// one's bits (within a few ulp; tested), so the two copies can differ in
// the last bits of a few outputs; torch's own vectorized CPU kernels differ
// from its scalar ones the same way.
#ifndef FLATSHARD_WORKER_DEVICE_HOST_HOST_GELU_KERNELS_H_
#define FLATSHARD_WORKER_DEVICE_HOST_HOST_GELU_KERNELS_H_

#include <cstddef>

#include "worker/device/host/host_isa.h"

namespace flatshard::host_kernels {

// y = GeluTanh(x), element by element.
void GeluTanhForward(const float* x, float* y, size_t count, HostIsa isa = HostIsa::kBest);

// dx = dy * GeluTanhGrad(x), x being the forward's input.
void GeluTanhBackward(const float* x, const float* dy, float* dx, size_t count,
                      HostIsa isa = HostIsa::kBest);

}  // namespace flatshard::host_kernels

#endif  // FLATSHARD_WORKER_DEVICE_HOST_HOST_GELU_KERNELS_H_
