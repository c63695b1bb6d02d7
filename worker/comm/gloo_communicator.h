// Communicator over Gloo's TCP transport, for host memory. Rendezvous goes
// through a flatshard Store (GlooStoreAdapter). Reduce-scatter is a ring over
// Gloo's unbound buffers that waits for its sends before reusing a buffer:
// Debian's ReduceScatterHalvingDoubling does not, and returns wrong sums
// (shared/MEASURED.md).
#ifndef FLATSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_
#define FLATSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_

#include <memory>
#include <string>

#include "absl/time/time.h"

#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace gloo {
class Context;
namespace transport {
class Device;
}  // namespace transport
}  // namespace gloo

namespace flatshard {

struct GlooOptions {
  std::string hostname = "127.0.0.1";          // address peers connect to
  absl::Duration timeout = absl::Seconds(60);  // per collective and for rendezvous
  std::string prefix = "gloo";                 // store namespace for this group
};

class GlooCommunicator : public Communicator {
 public:
  // Connects a full mesh among `size` ranks through `store`. Every rank calls it.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(std::shared_ptr<Store> store,
                                                                  int rank, int size,
                                                                  const GlooOptions& options);
  ~GlooCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  absl::Status AllGather(const void* input, void* output, size_t count, DType dtype) override;
  absl::Status ReduceScatter(const void* input, void* output, size_t count, DType dtype) override;
  absl::Status AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) override;
  absl::Status Broadcast(void* buffer, size_t count, DType dtype, int root) override;
  absl::Status Barrier() override;
  absl::StatusOr<std::unique_ptr<Communicator>> CreateSubgroup(const std::vector<int>& ranks,
                                                               absl::string_view name) override;

 private:
  GlooCommunicator(std::shared_ptr<Store> store, std::shared_ptr<gloo::transport::Device> device,
                   std::shared_ptr<gloo::Context> context, int rank, int size, GlooOptions options);

  std::shared_ptr<Store> store_;
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::Context> context_;
  int rank_;
  int size_;
  GlooOptions options_;
  std::vector<std::byte> work_;     // reduce-scatter partial sums, kept across calls
  std::vector<std::byte> scratch_;  // reduce-scatter receive buffer, kept across calls
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_GLOO_COMMUNICATOR_H_
