// The process-wide cache of host memory blocks behind the CPU device's pool (and
// the simulated device's backing memory): released blocks are kept by size and
// handed out again, like PyTorch's caching allocator. FSDP allocates and frees
// the same all-gather and gradient sizes every step, and fresh pages from the
// kernel cost a fault each (64 MiB is 16k faults, slower than moving the bytes
// over Gloo). Blocks are 64-byte aligned (cache lines, AVX-512 loads).
#ifndef FLATSHARD_WORKER_DEVICE_HOST_BLOCK_CACHE_H_
#define FLATSHARD_WORKER_DEVICE_HOST_BLOCK_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <vector>

namespace flatshard {

class BlockCache {
 public:
  static constexpr size_t kAlignment = 64;
  // Blocks below this size come from malloc's own free lists cheaply (glibc's
  // heap; its mmap threshold starts at 128 KiB and rises as blocks are freed,
  // and its heap top is trimmed back to the kernel); the cache is
  // for the large, repeated buffers: FSDP's all-gather and gradient buffers, and
  // the activations a pass allocates and frees in the same sizes every step (a
  // GPT's [512, 128..512] floats are 256 KiB-1 MiB; from malloc they came back
  // as fresh pages, ~3k page faults a forward + backward). Bounded so a job that
  // changes shapes cannot hoard memory: when a block would not fit, cached
  // blocks of other sizes are freed first (sizes no longer used stay behind
  // after a reshard or with variable-length batches).
  static constexpr size_t kMinCachedBytes = size_t{64} << 10;
  static constexpr size_t kMaxCachedBytes = size_t{2} << 30;
  // Blocks from this size are whole huge pages (Take).
  static constexpr size_t kHugePage = size_t{2} << 20;
  static constexpr size_t kHugeBytes = size_t{4} << 20;

  static BlockCache& Get();

  // A block of at least `bytes` (rounded up to the alignment; never null).
  std::byte* Take(size_t bytes);
  // Returns a block Take gave for the same `bytes`.
  void Give(std::byte* block, size_t bytes);

  // Bytes held in the cache, not in use.
  int64_t cached_bytes();

 private:
  BlockCache() = default;

  std::mutex mu_;
  std::map<size_t, std::vector<std::byte*>> free_;
  size_t cached_ = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_HOST_BLOCK_CACHE_H_
