#include "worker/comm/observed_collectives.h"

#include <utility>

namespace flatshard {

template <typename Run>
absl::Status ObservedCollectives::Timed(Stream& stream, CollectiveOp op, int64_t bytes,
                                        double bus_factor, Run&& run) {
  absl::StatusOr<std::shared_ptr<Event>> start = stream.Record();
  absl::Status status = start.status();
  if (status.ok()) status = run();
  absl::StatusOr<std::shared_ptr<Event>> end =
      status.ok() ? stream.Record() : absl::StatusOr<std::shared_ptr<Event>>(status);
  CollectiveSample sample{op, bytes, static_cast<double>(bytes) * bus_factor, 0.0, true};
  if (!status.ok() || !end.ok()) {
    sample.ok = false;
    observer_->Record(sample);
    return status.ok() ? end.status() : status;
  }
  std::lock_guard<std::mutex> lock(mu_);
  pending_.push_back(Pending{sample, *std::move(start), *std::move(end)});
  return absl::OkStatus();
}

void ObservedCollectives::Flush() {
  std::vector<Pending> pending;
  {
    std::lock_guard<std::mutex> lock(mu_);
    pending.swap(pending_);
  }
  for (Pending& p : pending) {
    // The streams were synchronized: these return at once.
    absl::Status status = p.end->Synchronize();
    absl::StatusOr<double> seconds =
        status.ok() ? p.end->SecondsSince(*p.start) : absl::StatusOr<double>(status);
    p.sample.ok = seconds.ok();
    p.sample.seconds = seconds.ok() ? *seconds : 0.0;
    observer_->Record(p.sample);
  }
}

absl::Status ObservedCollectives::AllGather(Stream& stream, DeviceSpan<const std::byte> input,
                                            DeviceSpan<std::byte> output, size_t count,
                                            DType dtype) {
  const int n = size();
  return Timed(stream, CollectiveOp::kAllGather, static_cast<int64_t>(count * DTypeSize(dtype)) * n,
               static_cast<double>(n - 1) / n,
               [&] { return inner_->AllGather(stream, input, output, count, dtype); });
}

absl::Status ObservedCollectives::ReduceScatter(Stream& stream, DeviceSpan<const std::byte> input,
                                                DeviceSpan<std::byte> output, size_t count,
                                                DType dtype) {
  const int n = size();
  return Timed(stream, CollectiveOp::kReduceScatter,
               static_cast<int64_t>(count * DTypeSize(dtype)) * n, static_cast<double>(n - 1) / n,
               [&] { return inner_->ReduceScatter(stream, input, output, count, dtype); });
}

absl::Status ObservedCollectives::ReduceScatterInPlace(Stream& stream, DeviceSpan<std::byte> buffer,
                                                       size_t count, DType dtype) {
  const int n = size();
  return Timed(stream, CollectiveOp::kReduceScatter,
               static_cast<int64_t>(count * DTypeSize(dtype)) * n, static_cast<double>(n - 1) / n,
               [&] { return inner_->ReduceScatterInPlace(stream, buffer, count, dtype); });
}

absl::Status ObservedCollectives::ReduceGradient(Stream& stream, const GradientReduction& r) {
  const int n = size();
  return Timed(stream, CollectiveOp::kReduceScatter,
               static_cast<int64_t>(r.count * DTypeSize(r.reduce_dtype)) * n,
               static_cast<double>(n - 1) / n, [&] { return inner_->ReduceGradient(stream, r); });
}

absl::Status ObservedCollectives::AllReduce(Stream& stream, DeviceSpan<std::byte> buffer,
                                            size_t count, DType dtype, ReduceOp op) {
  const int n = size();
  return Timed(stream, CollectiveOp::kAllReduce, static_cast<int64_t>(count * DTypeSize(dtype)),
               2.0 * (n - 1) / n,
               [&] { return inner_->AllReduce(stream, buffer, count, dtype, op); });
}

absl::Status ObservedCollectives::Broadcast(Stream& stream, DeviceSpan<std::byte> buffer,
                                            size_t count, DType dtype, int root) {
  return Timed(stream, CollectiveOp::kBroadcast, static_cast<int64_t>(count * DTypeSize(dtype)),
               1.0, [&] { return inner_->Broadcast(stream, buffer, count, dtype, root); });
}

std::unique_ptr<Collectives> ObserveCollectives(std::unique_ptr<Collectives> collectives,
                                                CollectiveObserver* observer) {
  if (observer == nullptr || collectives == nullptr) return collectives;
  return std::make_unique<ObservedCollectives>(std::move(collectives), observer);
}

}  // namespace flatshard
