#include "worker/device/host/host_buffer.h"

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <utility>
#include <vector>

namespace flatshard {
namespace {

constexpr size_t kAlignment = 64;
// Blocks below this size come from malloc's own free lists cheaply; the cache is
// for the large, repeated FSDP buffers. Bounded so a job that changes shapes
// cannot hoard memory.
constexpr size_t kMinCachedBytes = size_t{1} << 20;
constexpr size_t kMaxCachedBytes = size_t{2} << 30;

class BlockCache {
 public:
  static BlockCache& Get() {
    static BlockCache* const cache = new BlockCache();
    return *cache;
  }

  std::byte* Take(size_t bytes) {
    if (bytes >= kMinCachedBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end() && !it->second.empty()) {
        std::byte* block = it->second.back();
        it->second.pop_back();
        cached_ -= bytes;
        return block;
      }
    }
    void* block = std::aligned_alloc(kAlignment, bytes);
    if (block == nullptr) throw std::bad_alloc();
    return static_cast<std::byte*>(block);
  }

  void Give(std::byte* block, size_t bytes) {
    if (bytes >= kMinCachedBytes) {
      std::lock_guard<std::mutex> lock(mu_);
      if (cached_ + bytes <= kMaxCachedBytes) {
        free_[bytes].push_back(block);
        cached_ += bytes;
        return;
      }
    }
    std::free(block);
  }

 private:
  std::mutex mu_;
  std::map<size_t, std::vector<std::byte*>> free_;
  size_t cached_ = 0;
};

size_t RoundedBytes(size_t bytes) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return rounded == 0 ? kAlignment : rounded;
}

}  // namespace

HostBuffer::HostBuffer(size_t count, DType dtype, MemoryTracker* tracker, MemoryKind kind,
                       Init init)
    : count_(count), dtype_(dtype), tracker_(tracker), kind_(kind) {
  const size_t size = bytes();
  data_ = BlockCache::Get().Take(RoundedBytes(size));
  if (init == Init::kZero) std::memset(data_, 0, size);
  if (tracker_ != nullptr) tracker_->Add(kind_, static_cast<int64_t>(size));
}

HostBuffer::~HostBuffer() { Release(); }

HostBuffer::HostBuffer(HostBuffer&& other) noexcept { *this = std::move(other); }

HostBuffer& HostBuffer::operator=(HostBuffer&& other) noexcept {
  if (this != &other) {
    Release();
    data_ = std::exchange(other.data_, nullptr);
    count_ = std::exchange(other.count_, 0);
    dtype_ = other.dtype_;
    tracker_ = other.tracker_;
    kind_ = other.kind_;
  }
  return *this;
}

void HostBuffer::Release() {
  if (data_ == nullptr) return;
  if (tracker_ != nullptr) tracker_->Sub(kind_, static_cast<int64_t>(bytes()));
  BlockCache::Get().Give(data_, RoundedBytes(bytes()));
  data_ = nullptr;
  count_ = 0;
}

}  // namespace flatshard
