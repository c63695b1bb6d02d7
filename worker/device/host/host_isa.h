// Which compiled copy of a host kernel runs. Some host passes (the optimizer
// steps, GELU) are built twice on x86-64: for the baseline ISA and for AVX2 +
// FMA, the copy chosen at run time; tests and benchmarks name one to compare
// them.
#ifndef FLATSHARD_WORKER_DEVICE_HOST_HOST_ISA_H_
#define FLATSHARD_WORKER_DEVICE_HOST_HOST_ISA_H_

// On a function: compile it as the AVX2 copy of a host pass (x86-64 GCC and
// clang). Elsewhere it compiles as the baseline, and UseAvx2Fma never picks
// it, so the dispatching code needs no #if of its own.
#if defined(__x86_64__) && defined(__GNUC__)
#define FLATSHARD_AVX2_COPY [[gnu::target("avx2")]]
#else
#define FLATSHARD_AVX2_COPY
#endif

namespace flatshard::host_kernels {

enum class HostIsa {
  kBest,      // the best copy this CPU supports
  kPortable,  // the baseline x86-64 / any architecture build
  kAvx2Fma,   // x86-64 with AVX2 and FMA
};

// True if `isa` can run on this CPU (kBest and kPortable always can).
bool HostIsaSupported(HostIsa isa);

// True when `isa` (resolving kBest) means the AVX2 + FMA copy.
bool UseAvx2Fma(HostIsa isa);

}  // namespace flatshard::host_kernels

#endif  // FLATSHARD_WORKER_DEVICE_HOST_HOST_ISA_H_
