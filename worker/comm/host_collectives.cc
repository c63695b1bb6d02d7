#include "worker/comm/host_collectives.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "worker/comm/gradient_chunks.h"
#include "worker/device/host/host_exec_stream.h"

namespace flatshard {
namespace {

absl::StatusOr<HostExecStream*> HostStream(Stream& stream, absl::string_view op) {
  auto* host = dynamic_cast<HostExecStream*>(&stream);
  if (host == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": Gloo collectives run on the cpu and sim devices' streams; stream '", stream.name(),
        "' belongs to a device whose memory Gloo cannot reach (use staged collectives)"));
  }
  return host;
}

}  // namespace

HostCollectives::HostCollectives(std::unique_ptr<Communicator> owned)
    : comm_(owned.get()), owned_(std::move(owned)) {}

std::unique_ptr<HostCollectives> HostCollectives::Borrowing(Communicator* comm) {
  return std::unique_ptr<HostCollectives>(new HostCollectives(comm, nullptr));
}

absl::Status HostCollectives::AllGather(Stream& stream, DeviceSpan<const std::byte> input,
                                        DeviceSpan<std::byte> output, size_t count, DType dtype) {
  ASSIGN_OR_RETURN(HostExecStream * host, HostStream(stream, "AllGather"));
  const auto n = static_cast<size_t>(size());
  RETURN_IF_ERROR(
      CheckCollectiveSizes("AllGather", input.size(), count, output.size(), count * n, dtype));
  const size_t element = DTypeSize(dtype);
  Communicator* comm = comm_;
  return host->Submit(
      "AllGather",
      {ReadOf(input.first(count * element)), WriteOf(output.first(count * n * element))},
      [comm, count, dtype](const ResolvedAccesses& r) {
        return comm->AllGather(r.get<const void>(0), r.get<void>(1), count, dtype);
      });
}

absl::Status HostCollectives::ReduceScatter(Stream& stream, DeviceSpan<const std::byte> input,
                                            DeviceSpan<std::byte> output, size_t count,
                                            DType dtype) {
  ASSIGN_OR_RETURN(HostExecStream * host, HostStream(stream, "ReduceScatter"));
  const auto n = static_cast<size_t>(size());
  RETURN_IF_ERROR(
      CheckCollectiveSizes("ReduceScatter", input.size(), count * n, output.size(), count, dtype));
  const size_t element = DTypeSize(dtype);
  Communicator* comm = comm_;
  return host->Submit(
      "ReduceScatter",
      {ReadOf(input.first(count * n * element)), WriteOf(output.first(count * element))},
      [comm, count, dtype](const ResolvedAccesses& r) {
        return comm->ReduceScatter(r.get<const void>(0), r.get<void>(1), count, dtype);
      });
}

absl::Status HostCollectives::ReduceScatterInPlace(Stream& stream, DeviceSpan<std::byte> buffer,
                                                   size_t count, DType dtype) {
  ASSIGN_OR_RETURN(HostExecStream * host, HostStream(stream, "ReduceScatterInPlace"));
  const size_t total = count * static_cast<size_t>(size());
  RETURN_IF_ERROR(CheckCollectiveSizes("ReduceScatterInPlace", buffer.size(), total, buffer.size(),
                                       total, dtype));
  Communicator* comm = comm_;
  return host->Submit("ReduceScatterInPlace", {WriteOf(buffer.first(total * DTypeSize(dtype)))},
                      [comm, count, dtype](const ResolvedAccesses& r) {
                        return comm->ReduceScatterInPlace(r.get<void>(0), count, dtype);
                      });
}

absl::Status HostCollectives::ReduceGradient(Stream& stream, const GradientReduction& r) {
  ASSIGN_OR_RETURN(HostExecStream * host, HostStream(stream, "ReduceGradient"));
  RETURN_IF_ERROR(CheckGradientReduction(r, size()));
  const size_t total = r.count * static_cast<size_t>(size());
  Communicator* comm = comm_;
  GradientChunksSpec spec{nullptr,      r.grad.size(), r.count, r.reduce_dtype,
                          r.pre_divide, r.post_divide, nullptr, r.accumulate};
  return host->Submit("ReduceGradient",
                      {ReadOf(r.grad), WriteOf(r.work.first(total * DTypeSize(r.reduce_dtype))),
                       WriteOf(r.grad_shard)},
                      [comm, spec](const ResolvedAccesses& resolved) mutable {
                        spec.grad = resolved.get<const float>(0);
                        spec.grad_shard = resolved.get<float>(2);
                        std::unique_ptr<ReduceScatterChunks> chunks = MakeGradientChunks(spec);
                        return comm->ReduceScatterChunked(*chunks, resolved.get<void>(1),
                                                          spec.count, spec.reduce_dtype);
                      });
}

absl::Status HostCollectives::AllReduce(Stream& stream, DeviceSpan<std::byte> buffer, size_t count,
                                        DType dtype, ReduceOp op) {
  ASSIGN_OR_RETURN(HostExecStream * host, HostStream(stream, "AllReduce"));
  RETURN_IF_ERROR(
      CheckCollectiveSizes("AllReduce", buffer.size(), count, buffer.size(), count, dtype));
  Communicator* comm = comm_;
  return host->Submit("AllReduce", {WriteOf(buffer.first(count * DTypeSize(dtype)))},
                      [comm, count, dtype, op](const ResolvedAccesses& r) {
                        return comm->AllReduce(r.get<void>(0), count, dtype, op);
                      });
}

absl::Status HostCollectives::Broadcast(Stream& stream, DeviceSpan<std::byte> buffer, size_t count,
                                        DType dtype, int root) {
  ASSIGN_OR_RETURN(HostExecStream * host, HostStream(stream, "Broadcast"));
  RETURN_IF_ERROR(
      CheckCollectiveSizes("Broadcast", buffer.size(), count, buffer.size(), count, dtype));
  Communicator* comm = comm_;
  return host->Submit("Broadcast", {WriteOf(buffer.first(count * DTypeSize(dtype)))},
                      [comm, count, dtype, root](const ResolvedAccesses& r) {
                        return comm->Broadcast(r.get<void>(0), count, dtype, root);
                      });
}

absl::StatusOr<std::unique_ptr<Collectives>> HostCollectives::CreateSubgroup(
    const std::vector<int>& ranks, absl::string_view name) {
  ASSIGN_OR_RETURN(std::unique_ptr<Communicator> sub, comm_->CreateSubgroup(ranks, name));
  return std::unique_ptr<Collectives>(new HostCollectives(std::move(sub)));
}

}  // namespace flatshard
