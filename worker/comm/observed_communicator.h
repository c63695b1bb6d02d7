// A Communicator that times every collective of the one it wraps and reports
// it to a CollectiveObserver (the worker's metrics), so the runtime's
// communicators are instrumented without the Gloo or NCCL code knowing.
#ifndef FLATSHARD_WORKER_COMM_OBSERVED_COMMUNICATOR_H_
#define FLATSHARD_WORKER_COMM_OBSERVED_COMMUNICATOR_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "worker/comm/collective_observer.h"
#include "worker/comm/communicator.h"

namespace flatshard {

class ObservedCommunicator final : public Communicator {
 public:
  // `observer` must outlive this communicator.
  ObservedCommunicator(std::unique_ptr<Communicator> inner, CollectiveObserver* observer)
      : inner_(std::move(inner)), observer_(observer) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllGather(const void* input, void* output, size_t count, DType dtype) override;
  absl::Status ReduceScatter(const void* input, void* output, size_t count, DType dtype) override;
  absl::Status ReduceScatterInPlace(void* buffer, size_t count, DType dtype) override;
  absl::Status ReduceScatterChunked(ReduceScatterChunks& chunks, void* work, size_t count,
                                    DType dtype) override;
  absl::Status AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) override;
  absl::Status Gather(const void* input, void* output, size_t count, DType dtype,
                      int root) override;
  absl::Status Broadcast(void* buffer, size_t count, DType dtype, int root) override;
  absl::Status SendRecv(const void* send, size_t send_bytes, int to, void* recv, size_t recv_bytes,
                        int from) override;
  absl::Status Barrier() override;
  void Abort(const std::string& reason) override { inner_->Abort(reason); }
  // The subgroup is the inner communicator's, not observed: the caller wraps
  // it with the observer of the group it stands for.
  absl::StatusOr<std::unique_ptr<Communicator>> CreateSubgroup(const std::vector<int>& ranks,
                                                               absl::string_view name) override {
    return inner_->CreateSubgroup(ranks, name);
  }

 private:
  // A template, not std::function: no allocation on the collective path.
  template <typename Run>
  absl::Status Timed(CollectiveOp op, int64_t bytes, double bus_factor, Run&& run) {
    const auto start = std::chrono::steady_clock::now();
    absl::Status status = run();
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    observer_->Record(CollectiveSample{op, bytes, static_cast<double>(bytes) * bus_factor,
                                       elapsed.count(), status.ok()});
    return status;
  }

  std::unique_ptr<Communicator> inner_;
  CollectiveObserver* observer_;
};

// `comm` wrapped when `observer` is set, `comm` itself otherwise.
std::unique_ptr<Communicator> Observe(std::unique_ptr<Communicator> comm,
                                      CollectiveObserver* observer);

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_OBSERVED_COMMUNICATOR_H_
