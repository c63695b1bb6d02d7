// Launch shapes and block-level helpers shared by the CUDA kernels (CUDA C++
// only; the stream sees cuda_kernels.h). Elementwise kernels are grid-stride
// loops of kThreads-thread blocks, at most kMaxBlocks of them; row kernels give
// each row a block (grid-stride over rows).
#ifndef FLATSHARD_WORKER_DEVICE_CUDA_LAUNCH_CONFIG_CUH_
#define FLATSHARD_WORKER_DEVICE_CUDA_LAUNCH_CONFIG_CUH_

#include <cstddef>

#include <cuda_runtime.h>

#include <cub/block/block_reduce.cuh>

namespace flatshard::cuda {

inline constexpr int kThreads = 256;
inline constexpr size_t kMaxBlocks = 4096;

// Blocks for a grid-stride loop over `items` (> 0) items.
inline unsigned BlocksFor(size_t items) {
  const size_t blocks = (items + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

// Blocks for a loop that gives each of `rows` (> 0) rows a block.
inline unsigned RowBlocks(size_t rows) {
  return static_cast<unsigned>(rows < kMaxBlocks ? rows : kMaxBlocks);
}

// A runtime call that failed earlier on this thread (an out-of-memory
// allocation, say) leaves its error behind for cudaGetLastError; drop it so the
// check after a launch reports that launch. Sticky errors survive this and are
// reported by the launch, as they must be.
inline void ClearStaleError() { (void)cudaGetLastError(); }

__device__ inline size_t FirstIndex() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline size_t GridStride() { return static_cast<size_t>(gridDim.x) * blockDim.x; }

template <typename T>
using BlockReduce = cub::BlockReduce<T, kThreads>;

struct SumOp {
  template <typename T>
  __device__ T operator()(const T& a, const T& b) const {
    return a + b;
  }
};

// Combines one value per thread of the block with `op` (a fixed tree, so the
// result repeats bit for bit) and returns the result to every thread. Every
// thread of the block must call it; `temp` and `shared` may be reused by the
// next call.
template <typename T, typename Op>
__device__ T BlockAllReduce(T value, Op op, typename BlockReduce<T>::TempStorage& temp, T& shared) {
  const T reduced = BlockReduce<T>(temp).Reduce(value, op);
  if (threadIdx.x == 0) shared = reduced;
  __syncthreads();
  const T result = shared;
  __syncthreads();
  return result;
}

}  // namespace flatshard::cuda

#endif  // FLATSHARD_WORKER_DEVICE_CUDA_LAUNCH_CONFIG_CUH_
