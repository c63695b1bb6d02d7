// Communicator over NCCL for device memory, on its own CUDA stream (FSDP's
// unshard / post-backward streams). Same contract as the Gloo one
// (communicator.h): buffers are device pointers, every call returns when its
// collective has completed on the stream, so the runtime's communication lane
// gives the overlap with compute exactly as on CPU. Rendezvous: rank 0 puts the
// NCCL unique id in the Store (the coordinator's on a cluster).
#ifndef FLATSHARD_WORKER_COMM_NCCL_COMMUNICATOR_H_
#define FLATSHARD_WORKER_COMM_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <string>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include "absl/time/time.h"

#include "worker/comm/communicator.h"
#include "worker/comm/store.h"

namespace flatshard {

struct NcclOptions {
  int device = 0;                              // CUDA device ordinal of this rank
  absl::Duration timeout = absl::Seconds(60);  // rendezvous
  std::string prefix = "nccl";                 // store namespace for this group
};

class NcclCommunicator : public Communicator {
 public:
  // FAILED_PRECONDITION without a usable device.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(std::shared_ptr<Store> store,
                                                                  int rank, int size,
                                                                  const NcclOptions& options);
  ~NcclCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  cudaStream_t stream() const { return stream_; }

  absl::Status AllGather(const void* input, void* output, size_t count, DType dtype) override;
  absl::Status ReduceScatter(const void* input, void* output, size_t count, DType dtype) override;
  absl::Status AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) override;
  absl::Status Broadcast(void* buffer, size_t count, DType dtype, int root) override;
  absl::Status Barrier() override;
  void Abort(const std::string& reason) override;
  absl::StatusOr<std::unique_ptr<Communicator>> CreateSubgroup(const std::vector<int>& ranks,
                                                               absl::string_view name) override;

 private:
  NcclCommunicator(std::shared_ptr<Store> store, ncclComm_t comm, cudaStream_t stream, int rank,
                   int size, NcclOptions options);
  absl::Status Finish(ncclResult_t result, const char* op);

  std::shared_ptr<Store> store_;
  ncclComm_t comm_;
  cudaStream_t stream_;
  int rank_;
  int size_;
  NcclOptions options_;
  void* barrier_word_ = nullptr;  // one device float for Barrier
  bool failed_ = false;
  std::atomic<bool> aborted_{false};  // ncclCommAbort already freed comm_
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_COMM_NCCL_COMMUNICATOR_H_
