// The CPU device's block cache (worker/device/host/block_cache.h): blocks from
// the sizes a pass allocates again and again come back, so their pages are
// faulted in once; small ones are left to malloc; the cache is bounded; large
// ones are whole huge pages, advised as such.
#include "worker/device/host/block_cache.h"

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

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

// The VmFlags line of the mapping in /proc/self/smaps that holds `address`.
std::string VmFlagsAt(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto want = reinterpret_cast<uintptr_t>(address);
  std::string line;
  bool inside = false;
  while (std::getline(smaps, line)) {
    uintptr_t begin = 0, end = 0;
    char dash = 0;
    std::istringstream range(line);
    if (range >> std::hex >> begin >> dash >> end && dash == '-') {
      inside = begin <= want && want < end;
    } else if (inside && line.rfind("VmFlags:", 0) == 0) {
      return line;
    }
  }
  return "";
}

TEST(BlockCacheTest, ALargeBlockIsWholeHugePagesAdvisedAsSuch) {
  BlockCache& cache = BlockCache::Get();
  const size_t bytes = (size_t{6} << 20) + 100;  // not a multiple of 2 MiB
  std::byte* block = cache.Take(bytes);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(block) % BlockCache::kHugePage, 0u);
  block[0] = std::byte{1};
  block[bytes - 1] = std::byte{2};
  if (!std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) {
    cache.Give(block, bytes);
    GTEST_SKIP() << "this kernel has no transparent huge pages to advise";
  }
  // "hg": the mapping carries MADV_HUGEPAGE.
  const std::string flags = VmFlagsAt(block);
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
  cache.Give(block, bytes);
  EXPECT_EQ(cache.Take(bytes), block);  // and it is cached like any other
  cache.Give(block, bytes);
}

TEST(BlockCacheTest, BlocksBelowTheThresholdAreLeftToMalloc) {
  BlockCache& cache = BlockCache::Get();
  const int64_t before = cache.cached_bytes();
  const size_t below = BlockCache::kMinCachedBytes - BlockCache::kAlignment;
  std::byte* block = cache.Take(below);
  ASSERT_NE(block, nullptr);
  cache.Give(block, below);
  EXPECT_EQ(cache.cached_bytes(), before);
  block = cache.Take(BlockCache::kMinCachedBytes);  // the threshold itself is cached
  cache.Give(block, BlockCache::kMinCachedBytes);
  EXPECT_EQ(cache.cached_bytes(), before + static_cast<int64_t>(BlockCache::kMinCachedBytes));
}

TEST(BlockCacheTest, AFullCacheFreesOtherSizesToKeepANewOne) {
  // Two blocks of half what is left fill the cache to within 128 bytes
  // (never touched, so no pages behind them).
  BlockCache& cache = BlockCache::Get();
  const auto before = static_cast<size_t>(cache.cached_bytes());
  const size_t half =
      (BlockCache::kMaxCachedBytes - before) / 2 / BlockCache::kAlignment * BlockCache::kAlignment;
  std::byte* a = cache.Take(half);
  std::byte* b = cache.Take(half);
  cache.Give(a, half);
  cache.Give(b, half);
  ASSERT_EQ(cache.cached_bytes(), static_cast<int64_t>(before + 2 * half));
  // A block of a size in use now (one no other test caches): one of the
  // stale halves makes room for it.
  const size_t bytes = size_t{320} << 10;
  std::byte* block = cache.Take(bytes);
  cache.Give(block, bytes);
  EXPECT_EQ(cache.cached_bytes(), static_cast<int64_t>(before + half + bytes));
  EXPECT_EQ(cache.Take(bytes), block);
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
