// Row sums for the host kernels' row-wise reductions (LayerNorm's statistics,
// the softmaxes' normalisers). A sequential sum is one chain of dependent
// additions, 4 cycles each: over the GPT's 64-128-element rows that chain,
// not memory or arithmetic, was the kernels' cost. Eight interleaved partial
// sums break it into chains the CPU overlaps (and the compiler can put in
// vector registers). The order is fixed by this code, not by the ISA a copy
// was compiled for, so every copy of a kernel sums alike.
#ifndef FLATSHARD_WORKER_DEVICE_HOST_INTERLEAVED_SUM_H_
#define FLATSHARD_WORKER_DEVICE_HOST_INTERLEAVED_SUM_H_

#include <cstddef>

namespace flatshard::host_kernels {

inline constexpr size_t kSumLanes = 8;

// Σ term(i) over i < n in T: element i goes to partial sum i % kSumLanes,
// then the partial sums are added pairwise. `term` must be cheap and pure.
template <typename T, typename Term>
inline T InterleavedSum(size_t n, Term term) {
  T lane[kSumLanes] = {};
  size_t i = 0;
  for (; i + kSumLanes <= n; i += kSumLanes) {
    for (size_t l = 0; l < kSumLanes; ++l) lane[l] += term(i + l);
  }
  for (size_t l = 0; i < n; ++i, ++l) lane[l] += term(i);
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

}  // namespace flatshard::host_kernels

#endif  // FLATSHARD_WORKER_DEVICE_HOST_INTERLEAVED_SUM_H_
