// The strict simulated device: the evidence, on machines without a GPU, that the
// runtime orders its streams the way a GPU needs. It runs the CPU device's kernels
// (host_kernels.h, the same element bodies the CUDA build uses) but behaves like a
// GPU in every way the runtime could get wrong:
//   - Memory the host cannot read: a buffer's address is a fake, non-canonical
//     address (dereferencing it faults), translated to real memory only inside
//     the device's own operations. An operation handed anything but a live
//     allocation of this device (a host pointer, freed memory, out of bounds) is
//     refused.
//   - Asynchrony: every stream, the compute stream included, runs on a thread of
//     its own with a random delay before each operation, so work the host did not
//     wait for really is still running.
//   - Ordering checks: every stream keeps a vector clock of what it has waited
//     for (Stream::Wait on an Event carries the recorder's clock across), every
//     allocation remembers its last writer and its readers since, and an
//     operation that touches a buffer whose last conflicting use on another
//     stream is not ordered before it (a missing event wait, a release on the
//     wrong stream: the record-stream problem) is refused with an error naming
//     both operations and streams. Work the host issues after synchronizing
//     with a stream is ordered after that stream's finished work, as on a GPU. The checks are exact
//     happens-before, done when the work is issued, so they do not depend on the random timing.
//   - Host access to pinned memory is checked against the copies in flight the
//     same way (PinnedBuffer::Read/Write).
// A release that breaks the ordering cannot return an error, so it puts the
// device into a failed state: every later operation fails with the report.
#ifndef FLATSHARD_WORKER_DEVICE_SIM_SIM_DEVICE_H_
#define FLATSHARD_WORKER_DEVICE_SIM_SIM_DEVICE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"

#include "worker/device/device.h"
#include "worker/device/host/host_exec_stream.h"

namespace flatshard {

struct SimOptions {
  uint64_t seed = 1;  // of the random delays
  // Each operation waits a uniform random [0, max_delay_us] microseconds first.
  int max_delay_us = 50;
};

class SimStream;

class SimDevice : public Device {
 public:
  explicit SimDevice(SimOptions options = {});
  ~SimDevice() override;

  DeviceKind kind() const override { return DeviceKind::kSim; }
  std::string name() const override { return "sim"; }
  absl::Status MakeCurrent() override { return absl::OkStatus(); }
  absl::StatusOr<std::unique_ptr<Stream>> CreateStream(StreamRole role,
                                                       absl::string_view name) override;
  DeviceMemoryStats MemoryStats() const override;

  // The first ordering violation found by a release, if any (also returned by
  // every operation issued after it).
  absl::Status fault() const;

 protected:
  absl::StatusOr<void*> AllocateRaw(size_t bytes, Stream& stream) override;
  void FreeRaw(void* address, size_t bytes, Stream& stream) override;
  absl::StatusOr<std::byte*> AllocatePinnedRaw(size_t bytes) override;
  void FreePinnedRaw(std::byte* data, size_t bytes) override;
  absl::Status CheckHostAccess(const std::byte* data, size_t bytes, bool write) const override;

 private:
  friend class SimStream;
  friend class SimEvent;

  // One use of memory: a stream's operation, by its issue number on that stream.
  struct Use {
    int stream = -1;
    uint64_t seq = 0;
    std::string op;
  };
  struct History {
    Use last_write;          // stream -1: never written
    std::vector<Use> reads;  // since the last write, at most one per stream
  };
  struct Allocation {
    uintptr_t fake = 0;
    size_t bytes = 0;
    std::byte* real = nullptr;
    size_t real_bytes = 0;
    std::string stream;  // allocated on
    History history;
  };
  struct Pinned {
    size_t bytes = 0;
    History history;
  };
  struct StreamState {
    std::string name;
    uint64_t issued = 0;          // operations issued so far
    std::vector<uint64_t> clock;  // per stream: issued ops known complete before the next op
  };

  absl::Status SubmitOn(SimStream& stream, absl::string_view op,
                        const std::vector<MemoryAccess>& accesses, HostExecStream::Work work);
  // Stream::Record / Wait / Synchronize and Event::Synchronize bookkeeping.
  std::vector<uint64_t> RecordClock(int stream);
  void MergeClock(int stream, const std::vector<uint64_t>& clock);
  void MergeHostClock(const std::vector<uint64_t>& clock);

  // Work the host issues after it saw other streams' work complete (a
  // Synchronize) is ordered after that work: the stream's clock takes in the
  // host's. mu_ held.
  void LearnFromHost(int stream);
  // Whether `use` on another stream is ordered before stream `s`'s next work.
  bool Ordered(const StreamState& s, const Use& use, int self) const;
  // Checks one access and, if fine, gives its host address; records nothing.
  absl::StatusOr<void*> CheckAccess(int stream, absl::string_view op, const MemoryAccess& access,
                                    bool* pageable);
  void RecordUse(int stream, uint64_t seq, absl::string_view op, const MemoryAccess& access);
  std::string Describe(const Use& use) const;
  Allocation* FindAllocation(uintptr_t address, size_t bytes);
  Pinned* FindPinned(uintptr_t address, size_t bytes);
  const Pinned* FindPinned(uintptr_t address, size_t bytes) const;

  SimOptions options_;
  mutable std::mutex mu_;
  std::vector<StreamState> streams_;
  std::vector<uint64_t> host_clock_;             // what the host has seen complete
  std::map<uintptr_t, Allocation> allocations_;  // by fake address
  std::map<uintptr_t, Pinned> pinned_;           // by host address
  // Memory released while another stream may still use it (a fault): never
  // reused, returned to the block cache only when the device goes away.
  std::vector<std::pair<std::byte*, size_t>> quarantined_;
  uintptr_t next_fake_;
  int64_t in_use_ = 0;
  absl::Status fault_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_SIM_SIM_DEVICE_H_
