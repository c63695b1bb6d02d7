#include "worker/device/host/block_cache.h"

#include <cstdlib>
#include <new>

#include <sys/mman.h>

namespace flatshard {
namespace {

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
  if (size >= kHugeBytes) {
    // Whole 2 MiB pages, asked for as huge pages: one TLB entry per 2 MiB for
    // the GEMMs and element passes that stream these buffers, and one page to
    // pin per 2 MiB when a peer on this host reads them (process_vm_readv).
    // Debian's default is transparent huge pages only where madvised.
    const size_t whole = (size + kHugePage - 1) / kHugePage * kHugePage;
    void* block = std::aligned_alloc(kHugePage, whole);
    if (block == nullptr) throw std::bad_alloc();
    (void)madvise(block, whole, MADV_HUGEPAGE);  // advice: failing changes nothing
    return static_cast<std::byte*>(block);
  }
  void* block = std::aligned_alloc(kAlignment, size);
  if (block == nullptr) throw std::bad_alloc();
  return static_cast<std::byte*>(block);
}

void BlockCache::Give(std::byte* block, size_t bytes) {
  const size_t size = Rounded(bytes);
  if (size >= kMinCachedBytes && size <= kMaxCachedBytes) {
    std::lock_guard<std::mutex> lock(mu_);
    // Make room from other sizes, largest first; this size's own blocks are
    // what the next Take of it wants.
    for (auto it = free_.rbegin(); cached_ + size > kMaxCachedBytes && it != free_.rend(); ++it) {
      if (it->first == size) continue;
      while (!it->second.empty() && cached_ + size > kMaxCachedBytes) {
        std::free(it->second.back());
        it->second.pop_back();
        cached_ -= it->first;
      }
    }
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
