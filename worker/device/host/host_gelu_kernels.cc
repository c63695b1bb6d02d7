#include "worker/device/host/host_gelu_kernels.h"

#include <cmath>

#include "worker/device/host/libmvec_simd.h"
#include "worker/device/kernels/element_ops.h"

namespace flatshard::host_kernels {
namespace {

FLATSHARD_SCALAR void ForwardPortable(const float* x, float* y, size_t count) {
  for (size_t i = 0; i < count; ++i) y[i] = kernels::GeluTanh(x[i]);
}

FLATSHARD_SCALAR void BackwardPortable(const float* x, const float* dy, float* dx, size_t count) {
  for (size_t i = 0; i < count; ++i) dx[i] = dy[i] * kernels::GeluTanhGrad(x[i]);
}

#if FLATSHARD_HAVE_LIBMVEC
// The same loops for 8 lanes: the element formulas inline, and the expf in
// them becomes libmvec's AVX2 _ZGVdN8v_expf.
[[gnu::target("avx2,fma")]] void ForwardAvx2(const float* x, float* y, size_t count) {
#pragma omp simd
  for (size_t i = 0; i < count; ++i) y[i] = kernels::GeluTanh(x[i]);
}

[[gnu::target("avx2,fma")]] void BackwardAvx2(const float* x, const float* dy, float* dx,
                                              size_t count) {
#pragma omp simd
  for (size_t i = 0; i < count; ++i) dx[i] = dy[i] * kernels::GeluTanhGrad(x[i]);
}
#endif

}  // namespace

void GeluTanhForward(const float* x, float* y, size_t count, HostIsa isa) {
#if FLATSHARD_HAVE_LIBMVEC
  if (UseAvx2Fma(isa)) return ForwardAvx2(x, y, count);
#endif
  (void)isa;
  ForwardPortable(x, y, count);
}

void GeluTanhBackward(const float* x, const float* dy, float* dx, size_t count, HostIsa isa) {
#if FLATSHARD_HAVE_LIBMVEC
  if (UseAvx2Fma(isa)) return BackwardAvx2(x, dy, dx, count);
#endif
  (void)isa;
  BackwardPortable(x, dy, dx, count);
}

}  // namespace flatshard::host_kernels
