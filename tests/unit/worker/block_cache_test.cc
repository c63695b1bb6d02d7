// The CPU device's block cache (worker/device/host/block_cache.h): blocks from
// the sizes a pass allocates again and again come back, so their pages are
// faulted in once; small ones are left to malloc; the cache is bounded.
#include "worker/device/host/block_cache.h"

#include <cstddef>
#include <cstdint>

#include "gtest/gtest.h"

namespace flatshard {
namespace {

TEST(BlockCacheTest, AnActivationSizedBlockIsHandedOutAgain) {
  BlockCache& cache = BlockCache::Get();
  const size_t bytes = size_t{256} << 10;  // a GPT activation: [512, 128] floats
  const int64_t before = cache.cached_bytes();
  std::byte* block = cache.Take(bytes);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % BlockCache::kAlignment, 0u);
  block[bytes - 1] = std::byte{1};
  cache.Give(block, bytes);
  EXPECT_EQ(cache.cached_bytes(), before + static_cast<int64_t>(bytes));
  EXPECT_EQ(cache.Take(bytes), block);
  EXPECT_EQ(cache.cached_bytes(), before);
  cache.Give(block, bytes);
}

TEST(BlockCacheTest, SmallBlocksAreLeftToMalloc) {
  BlockCache& cache = BlockCache::Get();
  const int64_t before = cache.cached_bytes();
  std::byte* block = cache.Take(4096);
  ASSERT_NE(block, nullptr);
  cache.Give(block, 4096);
  EXPECT_EQ(cache.cached_bytes(), before);
}

TEST(BlockCacheTest, OnlyTheSameRoundedSizeReusesABlock) {
  BlockCache& cache = BlockCache::Get();
  const size_t bytes = size_t{1} << 20;
  std::byte* block = cache.Take(bytes);
  cache.Give(block, bytes);
  std::byte* other = cache.Take(bytes + 4096);  // another size: a fresh block
  EXPECT_NE(other, block);
  EXPECT_EQ(cache.Take(bytes - 10), block);  // rounds up to the same 64-byte size
  cache.Give(other, bytes + 4096);
  cache.Give(block, bytes);
}

}  // namespace
}  // namespace flatshard
