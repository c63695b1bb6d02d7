#include "worker/device/host/block_cache.h"

#include <cstdlib>
#include <new>

namespace flatshard {
namespace {

// Blocks below this size come from malloc's own free lists cheaply (glibc
// serves up to 128 KiB from its heap before it starts to mmap); the cache is
// for the large, repeated buffers: FSDP's all-gather and gradient buffers, and
// the activations a pass allocates and frees in the same sizes every step (a
// GPT's [512, 128..512] floats are 256 KiB-1 MiB; from malloc they came back
// as fresh pages, ~3k page faults a forward + backward). Bounded so a job that
// changes shapes cannot hoard memory.
constexpr size_t kMinCachedBytes = size_t{64} << 10;
constexpr size_t kMaxCachedBytes = size_t{2} << 30;

size_t Rounded(size_t bytes) {
  const size_t rounded =
      (bytes + BlockCache::kAlignment - 1) / BlockCache::kAlignment * BlockCache::kAlignment;
  return rounded == 0 ? BlockCache::kAlignment : rounded;
}

}  // namespace

BlockCache& BlockCache::Get() {
  static BlockCache* const cache = new BlockCache();
  return *cache;
}

std::byte* BlockCache::Take(size_t bytes) {
  const size_t size = Rounded(bytes);
  if (size >= kMinCachedBytes) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.find(size);
    if (it != free_.end() && !it->second.empty()) {
      std::byte* block = it->second.back();
      it->second.pop_back();
      cached_ -= size;
      return block;
    }
  }
  void* block = std::aligned_alloc(kAlignment, size);
  if (block == nullptr) throw std::bad_alloc();
  return static_cast<std::byte*>(block);
}

void BlockCache::Give(std::byte* block, size_t bytes) {
  const size_t size = Rounded(bytes);
  if (size >= kMinCachedBytes) {
    std::lock_guard<std::mutex> lock(mu_);
    if (cached_ + size <= kMaxCachedBytes) {
      free_[size].push_back(block);
      cached_ += size;
      return;
    }
  }
  std::free(block);
}

int64_t BlockCache::cached_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int64_t>(cached_);
}

}  // namespace flatshard
