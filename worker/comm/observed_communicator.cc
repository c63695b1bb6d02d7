#include "worker/comm/observed_communicator.h"

namespace flatshard {

absl::string_view CollectiveOpName(CollectiveOp op) {
  switch (op) {
    case CollectiveOp::kAllGather:
      return "all_gather";
    case CollectiveOp::kReduceScatter:
      return "reduce_scatter";
    case CollectiveOp::kAllReduce:
      return "all_reduce";
    case CollectiveOp::kBroadcast:
      return "broadcast";
    case CollectiveOp::kBarrier:
      return "barrier";
    case CollectiveOp::kSendRecv:
      return "send_recv";
    case CollectiveOp::kGather:
      return "gather";
  }
  return "unknown";
}

absl::Status ObservedCommunicator::AllGather(const void* input, void* output, size_t count,
                                             DType dtype) {
  const int n = size();
  return Timed(CollectiveOp::kAllGather, static_cast<int64_t>(count * DTypeSize(dtype)) * n,
               static_cast<double>(n - 1) / n,
               [&] { return inner_->AllGather(input, output, count, dtype); });
}

absl::Status ObservedCommunicator::ReduceScatter(const void* input, void* output, size_t count,
                                                 DType dtype) {
  const int n = size();
  return Timed(CollectiveOp::kReduceScatter, static_cast<int64_t>(count * DTypeSize(dtype)) * n,
               static_cast<double>(n - 1) / n,
               [&] { return inner_->ReduceScatter(input, output, count, dtype); });
}

absl::Status ObservedCommunicator::ReduceScatterInPlace(void* buffer, size_t count, DType dtype) {
  const int n = size();
  return Timed(CollectiveOp::kReduceScatter, static_cast<int64_t>(count * DTypeSize(dtype)) * n,
               static_cast<double>(n - 1) / n,
               [&] { return inner_->ReduceScatterInPlace(buffer, count, dtype); });
}

absl::Status ObservedCommunicator::ReduceScatterChunked(ReduceScatterChunks& chunks, void* work,
                                                        size_t count, DType dtype) {
  const int n = size();
  return Timed(CollectiveOp::kReduceScatter, static_cast<int64_t>(count * DTypeSize(dtype)) * n,
               static_cast<double>(n - 1) / n,
               [&] { return inner_->ReduceScatterChunked(chunks, work, count, dtype); });
}

absl::Status ObservedCommunicator::AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) {
  const int n = size();
  return Timed(CollectiveOp::kAllReduce, static_cast<int64_t>(count * DTypeSize(dtype)),
               2.0 * (n - 1) / n, [&] { return inner_->AllReduce(buffer, count, dtype, op); });
}

absl::Status ObservedCommunicator::Gather(const void* input, void* output, size_t count,
                                          DType dtype, int root) {
  const int n = size();
  return Timed(CollectiveOp::kGather, static_cast<int64_t>(count * DTypeSize(dtype)) * n,
               static_cast<double>(n - 1) / n,
               [&] { return inner_->Gather(input, output, count, dtype, root); });
}

absl::Status ObservedCommunicator::Broadcast(void* buffer, size_t count, DType dtype, int root) {
  return Timed(CollectiveOp::kBroadcast, static_cast<int64_t>(count * DTypeSize(dtype)), 1.0,
               [&] { return inner_->Broadcast(buffer, count, dtype, root); });
}

absl::Status ObservedCommunicator::SendRecv(const void* send, size_t send_bytes, int to, void* recv,
                                            size_t recv_bytes, int from) {
  return Timed(CollectiveOp::kSendRecv, static_cast<int64_t>(send_bytes + recv_bytes), 1.0,
               [&] { return inner_->SendRecv(send, send_bytes, to, recv, recv_bytes, from); });
}

absl::Status ObservedCommunicator::Barrier() {
  return Timed(CollectiveOp::kBarrier, 0, 0.0, [&] { return inner_->Barrier(); });
}

std::unique_ptr<Communicator> Observe(std::unique_ptr<Communicator> comm,
                                      CollectiveObserver* observer) {
  if (observer == nullptr || comm == nullptr) return comm;
  return std::make_unique<ObservedCommunicator>(std::move(comm), observer);
}

}  // namespace flatshard
