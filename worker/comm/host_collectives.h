// Collectives for the host-executed devices (CPU and simulated): each one runs a
// Gloo Communicator call as an operation of the host-executed stream it is issued
// on (worker/device/host/host_exec_stream.h), with the memory it reads and
// writes declared, so the simulated device checks a collective's buffers exactly
// like a kernel's. On the CPU device the communication stream's thread is the
// communication lane that overlaps Gloo with compute.
#ifndef FLATSHARD_WORKER_COMM_HOST_COLLECTIVES_H_
#define FLATSHARD_WORKER_COMM_HOST_COLLECTIVES_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/comm/collectives.h"

namespace flatshard {

class HostCollectives : public Collectives {
 public:
  // Runs `comm`'s collectives. Owns `comm` when `owned` is set; `borrowed`
  // variants leave it to the caller, who keeps it alive and uses it only while
  // no stream operation of this group is pending.
  explicit HostCollectives(std::unique_ptr<Communicator> owned);
  static std::unique_ptr<HostCollectives> Borrowing(Communicator* comm);

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  absl::Status AllGather(Stream& stream, DeviceSpan<const std::byte> input,
                         DeviceSpan<std::byte> output, size_t count, DType dtype) override;
  absl::Status ReduceScatter(Stream& stream, DeviceSpan<const std::byte> input,
                             DeviceSpan<std::byte> output, size_t count, DType dtype) override;
  absl::Status ReduceScatterInPlace(Stream& stream, DeviceSpan<std::byte> buffer, size_t count,
                                    DType dtype) override;
  // One operation on `stream`: the ring produces each chunk of the padded
  // gradient where it first reads it and accumulates this rank's chunk as it
  // completes it (Communicator::ReduceScatterChunked, gradient_chunks.h).
  absl::Status ReduceGradient(Stream& stream, const GradientReduction& r) override;
  absl::Status AllReduce(Stream& stream, DeviceSpan<std::byte> buffer, size_t count, DType dtype,
                         ReduceOp op) override;
  absl::Status Broadcast(Stream& stream, DeviceSpan<std::byte> buffer, size_t count, DType dtype,
                         int root) override;
  void Abort(const std::string& reason) override { comm_->Abort(reason); }
  absl::StatusOr<std::unique_ptr<Collectives>> CreateSubgroup(const std::vector<int>& ranks,
                                                              absl::string_view name) override;

  Communicator* communicator() const { return comm_; }

 private:
  HostCollectives(Communicator* comm, std::unique_ptr<Communicator> owned)
      : comm_(comm), owned_(std::move(owned)) {}

  Communicator* comm_;
  std::unique_ptr<Communicator> owned_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_HOST_COLLECTIVES_H_
