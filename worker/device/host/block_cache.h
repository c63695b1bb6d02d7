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
