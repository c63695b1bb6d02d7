// Gloo collectives for device memory that Gloo cannot reach: each collective
// copies its input to pinned host memory, waits for that copy, runs the Gloo
// Communicator on the host, and copies the result back on the same stream. This
// is `flatshard-worker --device cuda --comm gloo`: GPUs without NCCL, and several
// ranks sharing one GPU (which NCCL refuses), as in the GPU test suite. It is
// device-neutral (only Stream copies and pinned buffers), so the simulated
// device checks its staging too.
//
// The calling thread blocks for the Gloo part, so compute issued after a
// collective is issued later than with NCCL; correctness, not overlap, is what
// this path is for.
#ifndef FLATSHARD_WORKER_COMM_STAGED_COLLECTIVES_H_
#define FLATSHARD_WORKER_COMM_STAGED_COLLECTIVES_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/comm/collectives.h"
#include "worker/device/device.h"

namespace flatshard {

class StagedCollectives : public Collectives {
 public:
  // Runs `comm`'s collectives through pinned memory of `device`. Owns `comm`
  // when passed as owned; Borrowing leaves it to the caller.
  StagedCollectives(Device* device, std::unique_ptr<Communicator> owned);
  static std::unique_ptr<StagedCollectives> Borrowing(Device* device, Communicator* comm);

  int rank() const override { return comm_->rank(); }
  int size() const override { return comm_->size(); }
  absl::Status AllGather(Stream& stream, DeviceSpan<const std::byte> input,
                         DeviceSpan<std::byte> output, size_t count, DType dtype) override;
  absl::Status ReduceScatter(Stream& stream, DeviceSpan<const std::byte> input,
                             DeviceSpan<std::byte> output, size_t count, DType dtype) override;
  absl::Status ReduceScatterInPlace(Stream& stream, DeviceSpan<std::byte> buffer, size_t count,
                                    DType dtype) override;
  absl::Status AllReduce(Stream& stream, DeviceSpan<std::byte> buffer, size_t count, DType dtype,
                         ReduceOp op) override;
  absl::Status Broadcast(Stream& stream, DeviceSpan<std::byte> buffer, size_t count, DType dtype,
                         int root) override;
  void Abort(const std::string& reason) override { comm_->Abort(reason); }
  absl::StatusOr<std::unique_ptr<Collectives>> CreateSubgroup(const std::vector<int>& ranks,
                                                              absl::string_view name) override;

 private:
  StagedCollectives(Device* device, Communicator* comm, std::unique_ptr<Communicator> owned)
      : device_(device), comm_(comm), owned_(std::move(owned)) {}

  // Copies `input` into staging (after the stream's earlier work), runs `host`
  // on the staged bytes and copies `out_bytes` of the result into `output`.
  template <typename HostCollective>
  absl::Status Staged(Stream& stream, DeviceSpan<const std::byte> input, size_t out_bytes,
                      DeviceSpan<std::byte> output, HostCollective&& host);
  absl::StatusOr<PinnedBuffer*> Staging(PinnedBuffer& buffer, size_t bytes);

  Device* device_;
  Communicator* comm_;
  std::unique_ptr<Communicator> owned_;
  PinnedBuffer in_;  // reused: FSDP repeats the same sizes
  PinnedBuffer out_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_STAGED_COLLECTIVES_H_
