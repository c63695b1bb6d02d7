#include "worker/comm/staged_collectives.h"

#include <utility>

#include "core/status_macros.h"

namespace flatshard {

StagedCollectives::StagedCollectives(Device* device, std::unique_ptr<Communicator> owned)
    : device_(device), comm_(owned.get()), owned_(std::move(owned)) {}

std::unique_ptr<StagedCollectives> StagedCollectives::Borrowing(Device* device,
                                                                Communicator* comm) {
  return std::unique_ptr<StagedCollectives>(new StagedCollectives(device, comm, nullptr));
}

absl::StatusOr<PinnedBuffer*> StagedCollectives::Staging(PinnedBuffer& buffer, size_t bytes) {
  if (!buffer.allocated() || buffer.bytes() < bytes) {
    ASSIGN_OR_RETURN(buffer, device_->AllocatePinned(bytes));
  }
  return &buffer;
}

template <typename HostCollective>
absl::Status StagedCollectives::Staged(Stream& stream, DeviceSpan<const std::byte> input,
                                       size_t out_bytes, DeviceSpan<std::byte> output,
                                       HostCollective&& host) {
  // The copy back of the last collective reads `out_`: it must be done before
  // staging is replaced or rewritten.
  RETURN_IF_ERROR(stream.Synchronize());
  ASSIGN_OR_RETURN(PinnedBuffer * in, Staging(in_, input.size()));
  ASSIGN_OR_RETURN(PinnedBuffer * out, Staging(out_, out_bytes));
  RETURN_IF_ERROR(stream.CopyToHost(in->copy_target().first(input.size()), input));
  RETURN_IF_ERROR(stream.Synchronize());
  ASSIGN_OR_RETURN(std::span<const std::byte> staged_in, std::as_const(*in).Read<std::byte>());
  ASSIGN_OR_RETURN(std::span<std::byte> staged_out, out->Write<std::byte>());
  RETURN_IF_ERROR(host(staged_in.data(), staged_out.data()));
  return stream.CopyToDevice(output.first(out_bytes), out->copy_source().first(out_bytes));
}

absl::Status StagedCollectives::AllGather(Stream& stream, DeviceSpan<const std::byte> input,
                                          DeviceSpan<std::byte> output, size_t count, DType dtype) {
  const size_t n = static_cast<size_t>(size());
  const size_t element = DTypeSize(dtype);
  RETURN_IF_ERROR(
      CheckCollectiveSizes("AllGather", input.size(), count, output.size(), count * n, dtype));
  return Staged(
      stream, input.first(count * element), count * n * element, output,
      [&](const std::byte* in, std::byte* out) { return comm_->AllGather(in, out, count, dtype); });
}

absl::Status StagedCollectives::ReduceScatter(Stream& stream, DeviceSpan<const std::byte> input,
                                              DeviceSpan<std::byte> output, size_t count,
                                              DType dtype) {
  const size_t n = static_cast<size_t>(size());
  const size_t element = DTypeSize(dtype);
  RETURN_IF_ERROR(
      CheckCollectiveSizes("ReduceScatter", input.size(), count * n, output.size(), count, dtype));
  return Staged(stream, input.first(count * n * element), count * element, output,
                [&](const std::byte* in, std::byte* out) {
                  return comm_->ReduceScatter(in, out, count, dtype);
                });
}

absl::Status StagedCollectives::ReduceScatterInPlace(Stream& stream, DeviceSpan<std::byte> buffer,
                                                     size_t count, DType dtype) {
  // Staged out of place: the staging buffers are separate anyway, and only
  // this rank's chunk needs to travel back to the device.
  const size_t n = static_cast<size_t>(size());
  const size_t chunk = count * DTypeSize(dtype);
  RETURN_IF_ERROR(CheckCollectiveSizes("ReduceScatterInPlace", buffer.size(), count * n,
                                       buffer.size(), count * n, dtype));
  return Staged(stream, buffer.first(chunk * n), chunk,
                buffer.subspan(chunk * static_cast<size_t>(rank()), chunk),
                [&](const std::byte* in, std::byte* out) {
                  return comm_->ReduceScatter(in, out, count, dtype);
                });
}

absl::Status StagedCollectives::AllReduce(Stream& stream, DeviceSpan<std::byte> buffer,
                                          size_t count, DType dtype, ReduceOp op) {
  const size_t bytes = count * DTypeSize(dtype);
  RETURN_IF_ERROR(
      CheckCollectiveSizes("AllReduce", buffer.size(), count, buffer.size(), count, dtype));
  return Staged(stream, buffer.first(bytes), bytes, buffer,
                [&](const std::byte* in, std::byte* out) {
                  std::copy(in, in + bytes, out);
                  return comm_->AllReduce(out, count, dtype, op);
                });
}

absl::Status StagedCollectives::Broadcast(Stream& stream, DeviceSpan<std::byte> buffer,
                                          size_t count, DType dtype, int root) {
  const size_t bytes = count * DTypeSize(dtype);
  RETURN_IF_ERROR(
      CheckCollectiveSizes("Broadcast", buffer.size(), count, buffer.size(), count, dtype));
  return Staged(stream, buffer.first(bytes), bytes, buffer,
                [&](const std::byte* in, std::byte* out) {
                  std::copy(in, in + bytes, out);
                  return comm_->Broadcast(out, count, dtype, root);
                });
}

absl::StatusOr<std::unique_ptr<Collectives>> StagedCollectives::CreateSubgroup(
    const std::vector<int>& ranks, absl::string_view name) {
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, comm_->CreateSubgroup(ranks, name));
  return std::unique_ptr<Collectives>(new StagedCollectives(device_, std::move(sub)));
}

}  // namespace flatshard
