#include "worker/comm/nccl_collectives.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/status_macros.h"
#include "worker/device/cuda/cuda_status.h"
#include "worker/device/cuda/cuda_stream.h"

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

bool IsPowerOfTwo(double x) {
  int exponent = 0;
  return x > 0 && std::frexp(x, &exponent) == 0.5;
}

absl::StatusOr<cuda::CudaStream*> CudaStreamOf(Stream& stream, absl::string_view op) {
  auto* cuda_stream = dynamic_cast<cuda::CudaStream*>(&stream);
  if (cuda_stream == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        op, ": NCCL collectives run on CUDA streams; stream '", stream.name(), "' is not one"));
  }
  return cuda_stream;
}

}  // namespace

NcclCollectives::NcclCollectives(ncclComm_t comm, int rank, int size, NcclOptions options)
    : comm_(comm), rank_(rank), size_(size), options_(std::move(options)), watchdog_([this] {
        Watch();
      }) {}

NcclCollectives::~NcclCollectives() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  watchdog_.join();
  // Collectives still pending never complete on a failed communicator: abort
  // rather than wait for them. ncclCommAbort already freed an aborted one.
  if (failure_.ok()) {
    ncclCommDestroy(comm_);
  }
  for (InFlight& f : in_flight_) cudaEventDestroy(f.done);
}

absl::StatusOr<std::unique_ptr<NcclCollectives>> NcclCollectives::Create(
    const std::shared_ptr<Store>& store, int rank, int size, const NcclOptions& options) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", rank, " is outside a group of size ", size));
  }
  if (cuda::CudaDeviceCount() <= options.device) {
    return absl::FailedPreconditionError(absl::StrCat("nccl: CUDA device ", options.device,
                                                      " is not present (", cuda::CudaDeviceCount(),
                                                      " visible)"));
  }
  RETURN_IF_ERROR(cuda::CudaStatus(cudaSetDevice(options.device), "cudaSetDevice"));
  ncclUniqueId id;
  const std::string key = options.prefix + "/unique_id";
  if (rank == 0) {
    RETURN_IF_ERROR(cuda::NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
    RETURN_IF_ERROR(store->Set(key, std::string(id.internal, sizeof(id.internal))));
  } else {
    ASSIGN_OR_RETURN(std::string value, store->Get(key, options.timeout));
    if (value.size() != sizeof(id.internal)) {
      return absl::InternalError(absl::StrCat("nccl: store key '", key, "' holds ", value.size(),
                                              " bytes, not a unique id"));
    }
    std::memcpy(id.internal, value.data(), sizeof(id.internal));
  }
  ncclComm_t comm;
  RETURN_IF_ERROR(cuda::NcclStatus(ncclCommInitRank(&comm, size, id, rank), "ncclCommInitRank"));
  return std::unique_ptr<NcclCollectives>(new NcclCollectives(comm, rank, size, options));
}

template <typename Enqueue>
absl::Status NcclCollectives::Issue(Stream& stream, const char* op, Enqueue&& enqueue) {
  ASSIGN_OR_RETURN(cuda::CudaStream * cuda_stream, CudaStreamOf(stream, op));
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) return failure_;
  absl::Status status = cuda::NcclStatus(enqueue(cuda_stream->raw()), op);
  InFlight flight;
  if (status.ok()) {
    status = cuda::CudaStatus(cudaEventCreateWithFlags(&flight.done, cudaEventDisableTiming),
                              "cudaEventCreate");
  }
  if (status.ok()) {
    status = cuda::CudaStatus(cudaEventRecord(flight.done, cuda_stream->raw()), "cudaEventRecord");
  }
  if (!status.ok()) {
    if (flight.done != nullptr) cudaEventDestroy(flight.done);
    absl::Status failed = absl::UnavailableError(
        absl::StrCat("nccl rank ", rank_, " of ", size_, ": ", status.message()));
    FailLocked(failed);
    cuda_stream->Fail(failed);
    return failed;
  }
  flight.stream = &stream;
  flight.deadline = absl::Now() + options_.timeout;
  flight.op = op;
  in_flight_.push_back(std::move(flight));
  cv_.notify_all();
  return absl::OkStatus();
}

void NcclCollectives::FailLocked(const absl::Status& status) {
  if (!failure_.ok()) return;
  failure_ = status;
  // The streams first: whoever is waiting on them sees the error once the abort
  // has ended the kernels.
  for (InFlight& f : in_flight_) {
    static_cast<cuda::CudaStream*>(f.stream)->Fail(status);
    cudaEventDestroy(f.done);
  }
  in_flight_.clear();
  ncclCommAbort(comm_);
}

void NcclCollectives::Watch() {
  // CUDA calls on this thread need the communicator's device current.
  cudaSetDevice(options_.device);
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopping_) {
    cv_.wait_for(lock, absl::ToChronoMilliseconds(options_.poll_interval),
                 [this] { return stopping_; });
    if (stopping_ || !failure_.ok()) continue;
    ncclResult_t async = ncclSuccess;
    if (ncclCommGetAsyncError(comm_, &async) == ncclSuccess && async != ncclSuccess &&
        async != ncclInProgress) {
      FailLocked(absl::UnavailableError(
          absl::StrCat("nccl rank ", rank_, " of ", size_,
                       ": asynchronous error: ", ncclGetErrorString(async))));
      continue;
    }
    const absl::Time now = absl::Now();
    while (!in_flight_.empty()) {
      InFlight& oldest = in_flight_.front();
      const cudaError_t done = cudaEventQuery(oldest.done);
      if (done == cudaSuccess) {
        cudaEventDestroy(oldest.done);
        in_flight_.pop_front();
        continue;
      }
      if (done != cudaErrorNotReady) {
        FailLocked(absl::InternalError(
            absl::StrCat("nccl rank ", rank_, ": ", oldest.op, ": ", cudaGetErrorString(done))));
      } else if (now > oldest.deadline) {
        FailLocked(absl::DeadlineExceededError(absl::StrCat(
            "nccl rank ", rank_, " of ", size_, ": ", oldest.op, " did not complete in ",
            absl::FormatDuration(options_.timeout), " (a peer died or hangs)")));
      }
      break;
    }
  }
}

absl::Status NcclCollectives::AllGather(Stream& stream, DeviceSpan<const std::byte> input,
                                        DeviceSpan<std::byte> output, size_t count, DType dtype) {
  RETURN_IF_ERROR(CheckCollectiveSizes("AllGather", input.size(), count, output.size(),
                                       count * static_cast<size_t>(size_), dtype));
  return Issue(stream, "ncclAllGather", [&](cudaStream_t s) {
    return ncclAllGather(input.address(), output.address(), count, NcclType(dtype), comm_, s);
  });
}

absl::Status NcclCollectives::ReduceScatter(Stream& stream, DeviceSpan<const std::byte> input,
                                            DeviceSpan<std::byte> output, size_t count,
                                            DType dtype) {
  RETURN_IF_ERROR(CheckCollectiveSizes("ReduceScatter", input.size(),
                                       count * static_cast<size_t>(size_), output.size(), count,
                                       dtype));
  return Issue(stream, "ncclReduceScatter", [&](cudaStream_t s) {
    return ncclReduceScatter(input.address(), output.address(), count, NcclType(dtype), ncclSum,
                             comm_, s);
  });
}

absl::Status NcclCollectives::ReduceScatterInPlace(Stream& stream, DeviceSpan<std::byte> buffer,
                                                   size_t count, DType dtype) {
  const size_t total = count * static_cast<size_t>(size_);
  RETURN_IF_ERROR(CheckCollectiveSizes("ReduceScatterInPlace", buffer.size(), total, buffer.size(),
                                       total, dtype));
  // NCCL's in-place form: recvbuff == sendbuff + rank * recvcount.
  const size_t chunk = count * DTypeSize(dtype);
  DeviceSpan<std::byte> mine = buffer.subspan(chunk * static_cast<size_t>(rank_), chunk);
  return Issue(stream, "ncclReduceScatter", [&](cudaStream_t s) {
    return ncclReduceScatter(buffer.address(), mine.address(), count, NcclType(dtype), ncclSum,
                             comm_, s);
  });
}

absl::Status NcclCollectives::ReduceGradient(Stream& stream, const GradientReduction& r) {
  RETURN_IF_ERROR(CheckGradientReduction(r, size_));
  const size_t total = r.count * static_cast<size_t>(size_);
  // FSDP's pre-divide is a power of two (docs/fsdp-semantics.md §3.2), so
  // multiplying by its inverse inside the reduction rounds exactly as
  // dividing first. The post-divide may fold in too when it is a power of two
  // and nothing is accumulated: scaling by 2^-k commutes with rounding (short
  // of subnormals), so the sum then scaled is the scaled sum.
  if (r.reduce_dtype != DType::kFloat32 || r.grad.size() != total || !IsPowerOfTwo(r.pre_divide)) {
    return Collectives::ReduceGradient(stream, r);
  }
  const bool into_shard = !r.accumulate && IsPowerOfTwo(r.post_divide);
  const double scale = 1.0 / (into_shard ? r.pre_divide * r.post_divide : r.pre_divide);
  // Else this rank's chunk of the work buffer: where the work buffer is the
  // gradient itself, that is NCCL's in-place form (recvbuff = sendbuff +
  // rank * recvcount), the only overlap NCCL allows.
  const size_t chunk = r.count * sizeof(float);
  DeviceSpan<std::byte> out = into_shard
                                  ? AsWritableBytes(r.grad_shard)
                                  : r.work.subspan(static_cast<size_t>(rank_) * chunk, chunk);
  RETURN_IF_ERROR(Issue(stream, "ncclReduceScatter", [&](cudaStream_t s) {
    ncclRedOp_t op = ncclSum;
    float scalar = static_cast<float>(scale);
    if (scale != 1.0) {
      const ncclResult_t created =
          ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm_);
      if (created != ncclSuccess) return created;
    }
    const ncclResult_t issued =
        ncclReduceScatter(r.grad.address(), out.address(), r.count, ncclFloat32, op, comm_, s);
    // NCCL allows destroying an operator once the calls given it have returned.
    if (op != ncclSum) ncclRedOpDestroy(op, comm_);
    return issued;
  }));
  if (into_shard) return absl::OkStatus();
  if (!r.accumulate) RETURN_IF_ERROR(stream.Zero(AsWritableBytes(r.grad_shard)));
  return stream.AccumulateReducedGrad(DType::kFloat32, out, r.grad_shard, r.post_divide);
}

absl::Status NcclCollectives::AllReduce(Stream& stream, DeviceSpan<std::byte> buffer, size_t count,
                                        DType dtype, ReduceOp op) {
  RETURN_IF_ERROR(
      CheckCollectiveSizes("AllReduce", buffer.size(), count, buffer.size(), count, dtype));
  return Issue(stream, "ncclAllReduce", [&](cudaStream_t s) {
    return ncclAllReduce(buffer.address(), buffer.address(), count, NcclType(dtype),
                         op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, s);
  });
}

absl::Status NcclCollectives::Broadcast(Stream& stream, DeviceSpan<std::byte> buffer, size_t count,
                                        DType dtype, int root) {
  if (root < 0 || root >= size_) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast root ", root, " is outside a group of size ", size_));
  }
  RETURN_IF_ERROR(
      CheckCollectiveSizes("Broadcast", buffer.size(), count, buffer.size(), count, dtype));
  return Issue(stream, "ncclBroadcast", [&](cudaStream_t s) {
    return ncclBroadcast(buffer.address(), buffer.address(), count, NcclType(dtype), root, comm_,
                         s);
  });
}

void NcclCollectives::Abort(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  FailLocked(absl::AbortedError(absl::StrCat("nccl rank ", rank_, " aborted: ", reason)));
}

absl::StatusOr<std::unique_ptr<Collectives>> NcclCollectives::CreateSubgroup(
    const std::vector<int>& ranks, absl::string_view name) {
  auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "subgroup '", name, "' [", absl::StrJoin(ranks, ","), "] does not include rank ", rank_));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) return failure_;
  ncclComm_t sub;
  RETURN_IF_ERROR(cuda::NcclStatus(
      ncclCommSplit(comm_, ranks.front(), static_cast<int>(me - ranks.begin()), &sub, nullptr),
      "ncclCommSplit"));
  NcclOptions options = options_;
  options.prefix = absl::StrCat(options_.prefix, "/", name);
  return std::unique_ptr<Collectives>(new NcclCollectives(sub, static_cast<int>(me - ranks.begin()),
                                                          static_cast<int>(ranks.size()), options));
}

}  // namespace flatshard
