// Collectives that time every collective of the ones they wrap with device
// events recorded around it on its stream, and report it to a
// CollectiveObserver (the worker's metrics). On a GPU the host returns from a
// collective long before it runs, so host wall time would measure only the
// enqueue; events measure when the work actually ran, on every device. Samples
// are reported by Flush(), which the runtime calls once its streams have
// synchronized (end of a step or control batch).
#ifndef FLATSHARD_WORKER_COMM_OBSERVED_COLLECTIVES_H_
#define FLATSHARD_WORKER_COMM_OBSERVED_COLLECTIVES_H_

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "worker/comm/collective_observer.h"
#include "worker/comm/collectives.h"

namespace flatshard {

class ObservedCollectives final : public Collectives {
 public:
  // `observer` must outlive this object.
  ObservedCollectives(std::unique_ptr<Collectives> inner, CollectiveObserver* observer)
      : inner_(std::move(inner)), observer_(observer) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllGather(Stream& stream, DeviceSpan<const std::byte> input,
                         DeviceSpan<std::byte> output, size_t count, DType dtype) override;
  absl::Status ReduceScatter(Stream& stream, DeviceSpan<const std::byte> input,
                             DeviceSpan<std::byte> output, size_t count, DType dtype) override;
  absl::Status ReduceScatterInPlace(Stream& stream, DeviceSpan<std::byte> buffer, size_t count,
                                    DType dtype) override;
  // The inner group's reduction (fused where it fuses), observed as the
  // reduce-scatter of its padded input.
  absl::Status ReduceGradient(Stream& stream, const GradientReduction& r) override;
  absl::Status AllReduce(Stream& stream, DeviceSpan<std::byte> buffer, size_t count, DType dtype,
                         ReduceOp op) override;
  absl::Status Broadcast(Stream& stream, DeviceSpan<std::byte> buffer, size_t count, DType dtype,
                         int root) override;
  void Abort(const std::string& reason) override { inner_->Abort(reason); }
  // The subgroup is not observed: the caller wraps it with the observer of the
  // group it stands for.
  absl::StatusOr<std::unique_ptr<Collectives>> CreateSubgroup(const std::vector<int>& ranks,
                                                              absl::string_view name) override {
    return inner_->CreateSubgroup(ranks, name);
  }

  // Reports every collective whose events have completed; call after the
  // streams the collectives ran on were synchronized.
  void Flush();

 private:
  struct Pending {
    CollectiveSample sample;
    std::shared_ptr<Event> start, end;
  };

  template <typename Run>
  absl::Status Timed(Stream& stream, CollectiveOp op, int64_t bytes, double bus_factor, Run&& run);

  std::unique_ptr<Collectives> inner_;
  CollectiveObserver* observer_;
  std::mutex mu_;
  std::vector<Pending> pending_;
};

// `collectives` wrapped when `observer` is set, returned as is otherwise.
std::unique_ptr<Collectives> ObserveCollectives(std::unique_ptr<Collectives> collectives,
                                                CollectiveObserver* observer);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_OBSERVED_COLLECTIVES_H_
