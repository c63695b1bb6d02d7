// glibc's vector exponentials (libmvec) for the host kernels' marked loops.
//
// glibc declares expf / exp with SIMD clones itself only under -ffast-math,
// which would also let the compiler reorder the arithmetic. Declared here
// with `#pragma omp declare simd` (honoured by -fopenmp-simd, no OpenMP
// runtime), a loop marked `#pragma omp simd` in an AVX2 function calls
// _ZGVdN8v_expf / _ZGVdN4v_exp, and nothing else changes: IEEE semantics, no
// contraction. Include this only in the files whose loops want the vector
// exponentials (host_gelu_kernels.cc, host_softmax_kernels.cc), so that no
// other loop changes its expf.
//
//   FLATSHARD_HAVE_LIBMVEC  1 where the clones are declared (x86-64, GCC)
//   FLATSHARD_SCALAR        on a portable copy: keeps its loops scalar glibc
//                           calls, which GCC would otherwise vectorize with
//                           libmvec's SSE variants once the clones exist
#ifndef FLATSHARD_WORKER_DEVICE_HOST_LIBMVEC_SIMD_H_
#define FLATSHARD_WORKER_DEVICE_HOST_LIBMVEC_SIMD_H_

#include <cmath>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
extern "C" {
#pragma omp declare simd notinbranch
float expf(float) noexcept;
#pragma omp declare simd notinbranch
double exp(double) noexcept;
}
#define FLATSHARD_HAVE_LIBMVEC 1
#define FLATSHARD_SCALAR [[gnu::optimize("no-tree-vectorize")]]
#else
#define FLATSHARD_HAVE_LIBMVEC 0
#define FLATSHARD_SCALAR
#endif

#endif  // FLATSHARD_WORKER_DEVICE_HOST_LIBMVEC_SIMD_H_
