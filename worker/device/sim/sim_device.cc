#include "worker/device/sim/sim_device.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

#include "worker/device/host/block_cache.h"
#include "worker/device/host/host_event.h"
#include "worker/device/host/stream_thread.h"

namespace flatshard {
namespace {

// Fake device addresses: non-canonical on x86-64 and AArch64 (bits 63..48 are
// neither all zeros nor all ones), so a host dereference faults at once.
constexpr uintptr_t kFakeBase = 0x5151000000000000ull;
// Unused address space between allocations: an access running off the end of
// one buffer lands in no allocation and is refused.
constexpr uintptr_t kGuardBytes = 4096;
// Fresh memory reads as NaN floats (0xFF bytes) until written.
constexpr int kPoisonByte = 0xFF;

std::vector<uint64_t> Max(std::vector<uint64_t> a, const std::vector<uint64_t>& b) {
  if (a.size() < b.size()) a.resize(b.size(), 0);
  for (size_t i = 0; i < b.size(); ++i) a[i] = std::max(a[i], b[i]);
  return a;
}

uint64_t ClockAt(const std::vector<uint64_t>& clock, int stream) {
  const auto s = static_cast<size_t>(stream);
  return s < clock.size() ? clock[s] : 0;
}

}  // namespace

// An event carrying the recording stream's vector clock.
class SimEvent : public HostEvent {
 public:
  SimEvent(SimDevice* device, std::vector<uint64_t> clock)
      : HostEvent(device), sim_(device), clock_(std::move(clock)) {}

  const std::vector<uint64_t>& clock() const { return clock_; }

  // The host has now seen everything the event covers complete.
  absl::Status Synchronize() override {
    absl::Status status = HostEvent::Synchronize();
    sim_->MergeHostClock(clock_);
    return status;
  }

 private:
  SimDevice* sim_;
  std::vector<uint64_t> clock_;
};

class SimStream : public HostExecStream {
 public:
  SimStream(SimDevice* device, std::string name, int id, uint64_t seed, int max_delay_us)
      : HostExecStream(device, std::move(name)),
        sim_(device),
        id_(id),
        rng_(seed),
        max_delay_us_(max_delay_us),
        thread_([this] { Delay(); }) {}

  int id() const { return id_; }
  StreamThread& thread() { return thread_; }

  absl::Status Submit(absl::string_view op, std::vector<MemoryAccess> accesses,
                      Work work) override {
    return sim_->SubmitOn(*this, op, accesses, std::move(work));
  }

  absl::StatusOr<std::shared_ptr<Event>> Record() override {
    auto event = std::make_shared<SimEvent>(sim_, sim_->RecordClock(id_));
    thread_.PostAlways([event](const absl::Status& status) { event->Complete(status); });
    return std::shared_ptr<Event>(event);
  }

  absl::Status Wait(const Event& event) override {
    const auto* sim_event = dynamic_cast<const SimEvent*>(&event);
    if (sim_event == nullptr || sim_event->device() != sim_) {
      return absl::InvalidArgumentError(
          absl::StrCat("stream '", name(), "' cannot wait on an event of another device"));
    }
    if (absl::Status fault = sim_->fault(); !fault.ok()) return fault;
    sim_->MergeClock(id_, sim_event->clock());
    std::shared_ptr<HostEvent> target = const_cast<SimEvent*>(sim_event)->shared_from_this();
    // Only the device's order: HostEvent::Synchronize, not SimEvent's, so the
    // host's knowledge does not grow from a stream's wait.
    thread_.Post([target] { return target->HostEvent::Synchronize(); });
    return absl::OkStatus();
  }

  absl::Status Synchronize() override {
    auto event = std::make_shared<SimEvent>(sim_, sim_->RecordClock(id_));
    thread_.PostAlways([event](const absl::Status& status) { event->Complete(status); });
    return event->Synchronize();
  }

 private:
  void Delay() {
    if (max_delay_us_ <= 0) return;
    const auto us = static_cast<int64_t>(rng_() % static_cast<uint64_t>(max_delay_us_ + 1));
    if (us > 0) std::this_thread::sleep_for(std::chrono::microseconds(us));
  }

  SimDevice* sim_;
  int id_;
  std::mt19937_64 rng_;  // used by the stream's thread only
  int max_delay_us_;
  StreamThread thread_;  // last: joined before the rest goes
};

SimDevice::SimDevice(SimOptions options) : options_(options), next_fake_(kFakeBase) {}

SimDevice::~SimDevice() {
  for (auto& [fake, allocation] : allocations_) {
    BlockCache::Get().Give(allocation.real, allocation.real_bytes);
  }
  for (const auto& [real, bytes] : quarantined_) BlockCache::Get().Give(real, bytes);
}

absl::StatusOr<std::unique_ptr<Stream>> SimDevice::CreateStream(StreamRole /*role*/,
                                                                absl::string_view name) {
  int id = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    id = static_cast<int>(streams_.size());
    streams_.push_back(StreamState{std::string(name), 0, {}});
  }
  return std::unique_ptr<Stream>(new SimStream(this, std::string(name), id,
                                               options_.seed * 1000003u + static_cast<uint64_t>(id),
                                               options_.max_delay_us));
}

DeviceMemoryStats SimDevice::MemoryStats() const {
  std::lock_guard<std::mutex> lock(mu_);
  DeviceMemoryStats stats;
  stats.pool_in_use_bytes = in_use_;
  stats.pool_reserved_bytes = in_use_;
  return stats;
}

absl::Status SimDevice::fault() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fault_;
}

std::vector<uint64_t> SimDevice::RecordClock(int stream) {
  std::lock_guard<std::mutex> lock(mu_);
  LearnFromHost(stream);
  StreamState& s = streams_[static_cast<size_t>(stream)];
  std::vector<uint64_t> clock = s.clock;
  if (clock.size() <= static_cast<size_t>(stream)) clock.resize(static_cast<size_t>(stream) + 1, 0);
  clock[static_cast<size_t>(stream)] = s.issued;
  return clock;
}

void SimDevice::MergeClock(int stream, const std::vector<uint64_t>& clock) {
  std::lock_guard<std::mutex> lock(mu_);
  StreamState& s = streams_[static_cast<size_t>(stream)];
  s.clock = Max(std::move(s.clock), clock);
}

void SimDevice::MergeHostClock(const std::vector<uint64_t>& clock) {
  std::lock_guard<std::mutex> lock(mu_);
  host_clock_ = Max(std::move(host_clock_), clock);
}

void SimDevice::LearnFromHost(int stream) {
  StreamState& s = streams_[static_cast<size_t>(stream)];
  s.clock = Max(std::move(s.clock), host_clock_);
}

bool SimDevice::Ordered(const StreamState& s, const Use& use, int self) const {
  if (use.stream < 0 || use.stream == self) return true;
  return ClockAt(s.clock, use.stream) >= use.seq;
}

std::string SimDevice::Describe(const Use& use) const {
  return absl::StrCat(use.op, " (operation #", use.seq, " on stream '",
                      streams_[static_cast<size_t>(use.stream)].name, "')");
}

SimDevice::Allocation* SimDevice::FindAllocation(uintptr_t address, size_t bytes) {
  auto it = allocations_.upper_bound(address);
  if (it == allocations_.begin()) return nullptr;
  --it;
  Allocation& a = it->second;
  if (address < a.fake || address + bytes > a.fake + a.bytes) return nullptr;
  return &a;
}

SimDevice::Pinned* SimDevice::FindPinned(uintptr_t address, size_t bytes) {
  auto it = pinned_.upper_bound(address);
  if (it == pinned_.begin()) return nullptr;
  --it;
  if (address < it->first || address + bytes > it->first + it->second.bytes) return nullptr;
  return &it->second;
}

const SimDevice::Pinned* SimDevice::FindPinned(uintptr_t address, size_t bytes) const {
  return const_cast<SimDevice*>(this)->FindPinned(address, bytes);
}

absl::StatusOr<void*> SimDevice::CheckAccess(int stream, absl::string_view op,
                                             const MemoryAccess& access, bool* pageable) {
  const StreamState& s = streams_[static_cast<size_t>(stream)];
  const auto address = reinterpret_cast<uintptr_t>(access.address);
  const char* verb = access.write ? "writes" : "reads";
  if (access.bytes == 0) return static_cast<void*>(nullptr);
  History* history = nullptr;
  void* host = nullptr;
  std::string what;
  if (access.host) {
    Pinned* pinned = FindPinned(address, access.bytes);
    if (pinned == nullptr) {
      *pageable = true;  // copied before the call returns: nothing to order
      return const_cast<void*>(access.address);
    }
    history = &pinned->history;
    host = const_cast<void*>(access.address);
    what = absl::StrFormat("pinned host memory %p", access.address);
  } else {
    Allocation* a = FindAllocation(address, access.bytes);
    if (a == nullptr) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "sim: %s on stream '%s' %s %d bytes at %p, which is not inside a live allocation of "
          "this device (a host pointer, released memory, or out of bounds)",
          op, s.name, verb, access.bytes, access.address));
    }
    history = &a->history;
    host = a->real + (address - a->fake);
    what = absl::StrFormat("buffer %#x (%d bytes, allocated on stream '%s')", a->fake, a->bytes,
                           a->stream);
  }
  auto race = [&](const Use& other, const char* other_verb) {
    return absl::FailedPreconditionError(
        absl::StrCat("sim: ", op, " on stream '", s.name, "' ", verb, " ", what, " ", other_verb,
                     " by ", Describe(other), " without waiting for an event recorded after it"));
  };
  if (!Ordered(s, history->last_write, stream)) return race(history->last_write, "last written");
  if (access.write) {
    for (const Use& read : history->reads) {
      if (!Ordered(s, read, stream)) return race(read, "still read");
    }
  }
  return host;
}

void SimDevice::RecordUse(int stream, uint64_t seq, absl::string_view op,
                          const MemoryAccess& access) {
  if (access.bytes == 0) return;
  const auto address = reinterpret_cast<uintptr_t>(access.address);
  History* history = nullptr;
  if (access.host) {
    Pinned* pinned = FindPinned(address, access.bytes);
    if (pinned == nullptr) return;
    history = &pinned->history;
  } else {
    history = &FindAllocation(address, access.bytes)->history;
  }
  Use use{stream, seq, std::string(op)};
  if (access.write) {
    history->last_write = std::move(use);
    history->reads.clear();
    return;
  }
  for (Use& read : history->reads) {
    if (read.stream == stream) {
      read = std::move(use);
      return;
    }
  }
  history->reads.push_back(std::move(use));
}

absl::Status SimDevice::SubmitOn(SimStream& stream, absl::string_view op,
                                 const std::vector<MemoryAccess>& accesses,
                                 HostExecStream::Work work) {
  std::vector<void*> pointers;
  bool pageable = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fault_.ok()) return fault_;
    LearnFromHost(stream.id());
    for (const MemoryAccess& access : accesses) {
      absl::StatusOr<void*> host = CheckAccess(stream.id(), op, access, &pageable);
      if (!host.ok()) {
        std::fprintf(stderr, "flatshard %s\n", std::string(host.status().message()).c_str());
        return host.status();
      }
      pointers.push_back(*host);
    }
    StreamState& s = streams_[static_cast<size_t>(stream.id())];
    const uint64_t seq = ++s.issued;
    for (const MemoryAccess& access : accesses) RecordUse(stream.id(), seq, op, access);
  }
  std::string what(op);
  stream.thread().Post([what, pointers = std::move(pointers), work = std::move(work)] {
    absl::Status status = work(ResolvedAccesses(pointers));
    if (status.ok()) return status;
    return absl::Status(status.code(), absl::StrCat(what, ": ", status.message()));
  });
  // Pageable host memory: like CUDA, the copy is complete when the call returns.
  return pageable ? stream.Synchronize() : absl::OkStatus();
}

absl::StatusOr<void*> SimDevice::AllocateRaw(size_t bytes, Stream& stream) {
  auto* sim_stream = dynamic_cast<SimStream*>(&stream);
  if (sim_stream == nullptr) {
    return absl::InvalidArgumentError("sim: allocation on a stream of another device");
  }
  const size_t real_bytes = std::max<size_t>(bytes, 1);
  std::byte* real = BlockCache::Get().Take(real_bytes);
  std::memset(real, kPoisonByte, real_bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (!fault_.ok()) {
    BlockCache::Get().Give(real, real_bytes);
    return fault_;
  }
  LearnFromHost(sim_stream->id());
  StreamState& s = streams_[static_cast<size_t>(sim_stream->id())];
  Allocation a;
  a.fake = next_fake_;
  a.bytes = bytes;
  a.real = real;
  a.real_bytes = real_bytes;
  a.stream = s.name;
  // The memory becomes usable at this point of the allocating stream.
  a.history.last_write = Use{sim_stream->id(), ++s.issued, "the allocation"};
  next_fake_ += (real_bytes + kGuardBytes + 255) / 256 * 256;
  in_use_ += static_cast<int64_t>(bytes);
  const uintptr_t fake = a.fake;
  allocations_.emplace(fake, std::move(a));
  // The fake address is never dereferenced: it only names the allocation so
  // that a kernel touching it without a stream ordering is caught.
  return reinterpret_cast<void*>(fake);  // NOLINT(performance-no-int-to-ptr)
}

void SimDevice::FreeRaw(void* address, size_t bytes, Stream& stream) {
  auto* sim_stream = dynamic_cast<SimStream*>(&stream);
  std::lock_guard<std::mutex> lock(mu_);
  auto it = allocations_.find(reinterpret_cast<uintptr_t>(address));
  if (it == allocations_.end() || sim_stream == nullptr) {
    if (fault_.ok()) {
      fault_ = absl::InternalError(absl::StrFormat(
          "sim: release of %p on stream '%s', which is not a live allocation of this device",
          address, stream.name()));
      std::fprintf(stderr, "flatshard %s\n", std::string(fault_.message()).c_str());
    }
    return;
  }
  Allocation allocation = std::move(it->second);
  allocations_.erase(it);  // later uses are refused as use-after-release at once
  in_use_ -= static_cast<int64_t>(bytes);
  const int self = sim_stream->id();
  LearnFromHost(self);
  const StreamState& s = streams_[static_cast<size_t>(self)];
  std::vector<Use> uses = allocation.history.reads;
  uses.push_back(allocation.history.last_write);
  for (const Use& use : uses) {
    if (Ordered(s, use, self)) continue;
    if (fault_.ok()) {
      fault_ = absl::FailedPreconditionError(absl::StrFormat(
          "sim: buffer %#x (%d bytes, allocated on stream '%s') released on stream '%s' while %s "
          "may still use it: release it on a stream that waited for an event recorded after "
          "that use",
          allocation.fake, allocation.bytes, allocation.stream, s.name, Describe(use)));
      std::fprintf(stderr, "flatshard %s\n", std::string(fault_.message()).c_str());
    }
    // The other stream may still touch the memory: never reuse it.
    quarantined_.emplace_back(allocation.real, allocation.real_bytes);
    return;
  }
  std::byte* real = allocation.real;
  const size_t real_bytes = allocation.real_bytes;
  sim_stream->thread().PostAlways([real, real_bytes](const absl::Status&) {
    std::memset(real, kPoisonByte, real_bytes);  // a stale reader would see NaN
    BlockCache::Get().Give(real, real_bytes);
  });
}

absl::StatusOr<std::byte*> SimDevice::AllocatePinnedRaw(size_t bytes) {
  std::byte* data = BlockCache::Get().Take(std::max<size_t>(bytes, 1));
  std::lock_guard<std::mutex> lock(mu_);
  pinned_.emplace(reinterpret_cast<uintptr_t>(data), Pinned{std::max<size_t>(bytes, 1), {}});
  return data;
}

void SimDevice::FreePinnedRaw(std::byte* data, size_t bytes) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    pinned_.erase(reinterpret_cast<uintptr_t>(data));
  }
  BlockCache::Get().Give(data, std::max<size_t>(bytes, 1));
}

absl::Status SimDevice::CheckHostAccess(const std::byte* data, size_t bytes, bool write) const {
  std::lock_guard<std::mutex> lock(mu_);
  const Pinned* pinned = FindPinned(reinterpret_cast<uintptr_t>(data), bytes);
  if (pinned == nullptr) return absl::OkStatus();
  auto unsynchronized = [&](const Use& use) {
    return use.stream >= 0 && ClockAt(host_clock_, use.stream) < use.seq;
  };
  auto report = [&](const Use& use) {
    absl::Status status = absl::FailedPreconditionError(absl::StrFormat(
        "sim: the host %s pinned memory %p that %s may still be using: synchronize that stream "
        "or an event recorded after it first",
        write ? "writes" : "reads", static_cast<const void*>(data), Describe(use)));
    std::fprintf(stderr, "flatshard %s\n", std::string(status.message()).c_str());
    return status;
  };
  if (unsynchronized(pinned->history.last_write)) return report(pinned->history.last_write);
  if (write) {
    for (const Use& read : pinned->history.reads) {
      if (unsynchronized(read)) return report(read);
    }
  }
  return absl::OkStatus();
}

}  // namespace flatshard
