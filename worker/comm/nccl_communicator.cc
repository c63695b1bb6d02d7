#include "worker/comm/nccl_communicator.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "worker/device/cuda/cuda_status.h"

namespace flatshard {
namespace {

ncclDataType_t NcclType(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kFloat16:
      return ncclFloat16;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

}  // namespace

NcclCommunicator::NcclCommunicator(std::shared_ptr<Store> store, ncclComm_t comm,
                                   cudaStream_t stream, int rank, int size, NcclOptions options)
    : store_(std::move(store)),
      comm_(comm),
      stream_(stream),
      rank_(rank),
      size_(size),
      options_(std::move(options)) {}

NcclCommunicator::~NcclCommunicator() {
  // A communicator that saw an error may have collectives pending that will
  // never complete: abort rather than wait for them.
  if (aborted_.load()) {
    // Abort() released the communicator already.
  } else if (failed_) {
    ncclCommAbort(comm_);
  } else {
    ncclCommDestroy(comm_);
  }
  if (barrier_word_ != nullptr) cudaFree(barrier_word_);
  cudaStreamDestroy(stream_);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<Store> store, int rank, int size, const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", rank, " is outside a group of size ", size));
  }
  if (cuda::CudaDeviceCount() <= options.device) {
    return absl::FailedPreconditionError(absl::StrCat("nccl: CUDA device ", options.device,
                                                      " is not present (", cuda::CudaDeviceCount(),
                                                      " visible)"));
  }
  if (absl::Status s = cuda::CudaStatus(cudaSetDevice(options.device), "cudaSetDevice"); !s.ok()) {
    return s;
  }
  ncclUniqueId id;
  const std::string key = options.prefix + "/unique_id";
  if (rank == 0) {
    if (absl::Status s = cuda::NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) {
      return s;
    }
    if (absl::Status s = store->Set(key, std::string(id.internal, sizeof(id.internal))); !s.ok()) {
      return s;
    }
  } else {
    absl::StatusOr<std::string> value = store->Get(key, options.timeout);
    if (!value.ok()) return value.status();
    if (value->size() != sizeof(id.internal)) {
      return absl::InternalError(absl::StrCat("nccl: store key '", key, "' holds ", value->size(),
                                              " bytes, not a unique id"));
    }
    std::memcpy(id.internal, value->data(), sizeof(id.internal));
  }
  ncclComm_t comm;
  if (absl::Status s =
          cuda::NcclStatus(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank");
      !s.ok()) {
    return s;
  }
  cudaStream_t stream;
  if (absl::Status s = cuda::CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                        "cudaStreamCreate");
      !s.ok()) {
    ncclCommDestroy(comm);
    return s;
  }
  std::unique_ptr<NcclCommunicator> communicator(
      new NcclCommunicator(std::move(store), comm, stream, rank, size, options));
  if (absl::Status s =
          cuda::CudaStatus(cudaMalloc(&communicator->barrier_word_, sizeof(float)), "cudaMalloc");
      !s.ok()) {
    return s;
  }
  return communicator;
}

absl::Status NcclCommunicator::Finish(ncclResult_t result, const char* op) {
  absl::Status status = cuda::NcclStatus(result, op);
  if (status.ok()) status = cuda::CudaStatus(cudaStreamSynchronize(stream_), op);
  if (!status.ok()) {
    failed_ = true;
    return absl::UnavailableError(
        absl::StrCat("nccl rank ", rank_, " of ", size_, ": ", status.message()));
  }
  return status;
}

absl::Status NcclCommunicator::AllGather(const void* input, void* output, size_t count,
                                         DType dtype) {
  return Finish(ncclAllGather(input, output, count, NcclType(dtype), comm_, stream_),
                "ncclAllGather");
}

absl::Status NcclCommunicator::ReduceScatter(const void* input, void* output, size_t count,
                                             DType dtype) {
  return Finish(ncclReduceScatter(input, output, count, NcclType(dtype), ncclSum, comm_, stream_),
                "ncclReduceScatter");
}

absl::Status NcclCommunicator::AllReduce(void* buffer, size_t count, DType dtype, ReduceOp op) {
  return Finish(ncclAllReduce(buffer, buffer, count, NcclType(dtype),
                              op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, stream_),
                "ncclAllReduce");
}

absl::Status NcclCommunicator::Broadcast(void* buffer, size_t count, DType dtype, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside a group of size ", size_));
  }
  return Finish(ncclBroadcast(buffer, buffer, count, NcclType(dtype), root, comm_, stream_),
                "ncclBroadcast");
}

absl::Status NcclCommunicator::Barrier() {
  return AllReduce(barrier_word_, 1, DType::kFloat32, ReduceOp::kSum);
}

void NcclCommunicator::Abort(const std::string& /*reason*/) {
  // ncclCommAbort stops the kernels in flight, so a stream synchronisation
  // waiting on them returns (with an error) on the thread issuing them.
  if (!aborted_.exchange(true)) ncclCommAbort(comm_);
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::CreateSubgroup(
    const std::vector<int>& ranks, absl::string_view name) {
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "subgroup '", name, "' [", absl::StrJoin(ranks, ","), "] does not include rank ", rank_));
  }
  NcclOptions options = options_;
  options.prefix = absl::StrCat(options_.prefix, "/", name);
  absl::StatusOr<std::unique_ptr<NcclCommunicator>> sub =
      Create(store_, static_cast<int>(me - ranks.begin()), static_cast<int>(ranks.size()), options);
  if (!sub.ok()) return sub.status();
  return std::unique_ptr<Communicator>(std::move(*sub));
}

}  // namespace flatshard
