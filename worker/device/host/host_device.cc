#include "worker/device/host/host_device.h"

#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

#include "worker/device/host/block_cache.h"
#include "worker/device/host/host_event.h"
#include "worker/device/host/host_exec_stream.h"
#include "worker/device/host/stream_thread.h"

namespace flatshard {
namespace {

std::vector<void*> Pointers(const std::vector<MemoryAccess>& accesses) {
  std::vector<void*> pointers;
  pointers.reserve(accesses.size());
  for (const MemoryAccess& a : accesses) pointers.push_back(const_cast<void*>(a.address));
  return pointers;
}

const HostEvent* OwnEvent(const Device* device, const Event& event, const std::string& stream) {
  const auto* host = dynamic_cast<const HostEvent*>(&event);
  if (host == nullptr || host->device() != device) return nullptr;
  (void)stream;
  return host;
}

// Runs every operation at once on the calling thread.
class InlineStream : public HostExecStream {
 public:
  InlineStream(Device* device, std::string name) : HostExecStream(device, std::move(name)) {}

  absl::Status Submit(absl::string_view op, std::vector<MemoryAccess> accesses,
                      Work work) override {
    if (!failure_.ok()) return failure_;
    absl::Status status = work(ResolvedAccesses(Pointers(accesses)));
    if (!status.ok()) {
      failure_ = absl::Status(status.code(), absl::StrCat(op, ": ", status.message()));
      return failure_;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Event>> Record() override {
    auto event = std::make_shared<HostEvent>(&device());
    event->Complete(failure_);
    return event;
  }

  absl::Status Wait(const Event& event) override {
    const HostEvent* host = OwnEvent(&device(), event, name());
    if (host == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("stream '", name(), "' cannot wait on an event of another device"));
    }
    absl::Status status = const_cast<HostEvent*>(host)->Synchronize();
    if (!status.ok() && failure_.ok()) failure_ = status;
    return status;
  }

  absl::Status Synchronize() override { return failure_; }

 private:
  absl::Status failure_;
};

// Runs operations in order on a thread of its own.
class ThreadStream : public HostExecStream {
 public:
  ThreadStream(Device* device, std::string name) : HostExecStream(device, std::move(name)) {}

  absl::Status Submit(absl::string_view op, std::vector<MemoryAccess> accesses,
                      Work work) override {
    bool touches_host = false;
    const auto& host = static_cast<const HostDevice&>(device());
    for (const MemoryAccess& a : accesses) {
      touches_host |= a.host && !host.IsPinned(a.address, a.bytes);
    }
    std::string what(op);
    thread_.Post([what, pointers = Pointers(accesses), work = std::move(work)] {
      absl::Status status = work(ResolvedAccesses(pointers));
      if (status.ok()) return status;
      return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
    });
    // Pageable host memory: the copy completes before the call returns, as
    // CUDA's pageable copies do (pinned memory's copies run on the thread).
    return touches_host ? Synchronize() : absl::OkStatus();
  }

  absl::StatusOr<std::shared_ptr<Event>> Record() override {
    auto event = std::make_shared<HostEvent>(&device());
    thread_.RunOrPostAlways([event](const absl::Status& status) { event->Complete(status); });
    return event;
  }

  absl::Status Wait(const Event& event) override {
    const HostEvent* host = OwnEvent(&device(), event, name());
    if (host == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("stream '", name(), "' cannot wait on an event of another device"));
    }
    // Work that already ran needs no waiting: nothing to queue.
    if (std::optional<absl::Status> done = host->StatusIfDone(); done.has_value() && done->ok()) {
      return absl::OkStatus();
    }
    // The caller may drop its handle at once: the thread keeps the event alive.
    std::shared_ptr<HostEvent> target = const_cast<HostEvent*>(host)->shared_from_this();
    thread_.Post([target] { return target->Synchronize(); });
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    auto event = std::make_shared<HostEvent>(&device());
    thread_.RunOrPostAlways([event](const absl::Status& status) { event->Complete(status); });
    return event->Synchronize();
  }

  void RunOrPostAlways(const std::function<void(const absl::Status&)>& task) {
    thread_.RunOrPostAlways(task);
  }

 private:
  StreamThread thread_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Stream>> HostDevice::CreateStream(StreamRole role,
                                                                 absl::string_view name) {
  if (role == StreamRole::kCompute) {
    return std::unique_ptr<Stream>(new InlineStream(this, std::string(name)));
  }
  return std::unique_ptr<Stream>(new ThreadStream(this, std::string(name)));
}

DeviceMemoryStats HostDevice::MemoryStats() const {
  DeviceMemoryStats stats;
  stats.pool_in_use_bytes = in_use_.load();
  stats.pool_reserved_bytes = stats.pool_in_use_bytes + BlockCache::Get().cached_bytes();
  return stats;
}

absl::StatusOr<void*> HostDevice::AllocateRaw(size_t bytes, Stream& /*stream*/) {
  in_use_ += static_cast<int64_t>(bytes);
  return static_cast<void*>(BlockCache::Get().Take(bytes));
}

void HostDevice::FreeRaw(void* address, size_t bytes, Stream& stream) {
  auto* block = static_cast<std::byte*>(address);
  auto give = [this, block, bytes] {
    BlockCache::Get().Give(block, bytes);
    in_use_ -= static_cast<int64_t>(bytes);
  };
  if (auto* thread = dynamic_cast<ThreadStream*>(&stream); thread != nullptr) {
    thread->RunOrPostAlways([give](const absl::Status&) { give(); });
  } else {
    give();  // the inline stream has run everything issued before this point
  }
}

absl::StatusOr<std::byte*> HostDevice::AllocatePinnedRaw(size_t bytes) {
  std::byte* block = BlockCache::Get().Take(bytes);
  std::lock_guard<std::mutex> lock(pinned_mu_);
  pinned_[reinterpret_cast<uintptr_t>(block)] = bytes;
  return block;
}

void HostDevice::FreePinnedRaw(std::byte* data, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(pinned_mu_);
    pinned_.erase(reinterpret_cast<uintptr_t>(data));
  }
  BlockCache::Get().Give(data, bytes);
}

void HostDevice::AdoptPinnedRaw(std::byte* data, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(pinned_mu_);
    pinned_.erase(reinterpret_cast<uintptr_t>(data));
  }
  in_use_ += static_cast<int64_t>(bytes);
}

bool HostDevice::IsPinned(const void* data, size_t bytes) const {
  const auto address = reinterpret_cast<uintptr_t>(data);
  std::lock_guard<std::mutex> lock(pinned_mu_);
  auto it = pinned_.upper_bound(address);
  if (it == pinned_.begin()) return false;
  --it;
  return address >= it->first && address + bytes <= it->first + it->second;
}

}  // namespace flatshard
