#include "worker/comm/host_collectives.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
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

absl::Status CheckCollectiveSizes(absl::string_view op, size_t input_bytes, size_t in_count,
                                  size_t output_bytes, size_t out_count, DType dtype) {
  const size_t element = DTypeSize(dtype);
  if (input_bytes < in_count * element || output_bytes < out_count * element) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": buffers of ", input_bytes, " and ", output_bytes, " bytes cannot hold ",
                     in_count, " and ", out_count, " ", DTypeName(dtype), " elements"));
  }
  return absl::OkStatus();
}

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
