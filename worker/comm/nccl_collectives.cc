#include "worker/comm/nccl_collectives.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

#include "core/status_macros.h"
#include "core/status_payloads.h"
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

// A failed NCCL call's code: an abort that ended its wait stays ABORTED and
// a wait that ran out of time DEADLINE_EXCEEDED (neither is this rank's own
// failure); anything else lost a peer.
absl::StatusCode WaitFailureCode(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kDeadlineExceeded:
      return status.code();
    default:
      return absl::StatusCode::kUnavailable;
  }
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
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  const ncclResult_t started = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  PollingWait wait;
  wait.deadline = absl::Now() + options.timeout;
  wait.poll = options.poll_interval;
  wait.aborted = [signal = options.abort.get()]() -> std::optional<std::string> {
    if (signal != nullptr && signal->aborted()) return signal->reason();
    return std::nullopt;
  };
  const std::string waiting_for =
      absl::StrCat("the group's other ", size - 1, " ranks to join: one died or never started");
  wait.waiting_for = waiting_for;
  absl::Status joined = comm != nullptr
                            ? NcclCallStatus(comm, started, "ncclCommInitRankConfig", wait)
                            : cuda::NcclStatus(started, "ncclCommInitRankConfig");
  if (joined.ok() && comm == nullptr) {
    joined = absl::InternalError("ncclCommInitRankConfig returned no communicator");
  }
  if (!joined.ok()) {
    // Ends NCCL's initialization thread and frees what it made.
    if (comm != nullptr) ncclCommAbort(comm);
    return PrefixStatus(absl::StrCat("nccl rank ", rank, " of ", size, ": "), joined);
  }
  return std::unique_ptr<NcclCollectives>(new NcclCollectives(comm, rank, size, options));
}

std::optional<std::string> NcclCollectives::AbortReason() const {
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (abort_reason_.has_value()) return abort_reason_;
  }
  if (options_.abort != nullptr && options_.abort->aborted()) return options_.abort->reason();
  return std::nullopt;
}

PollingWait NcclCollectives::Waiting(absl::string_view waiting_for,
                                     absl::Duration yield_for) const {
  PollingWait wait;
  wait.deadline = absl::Now() + options_.timeout;
  wait.yield_for = yield_for;
  wait.poll = options_.poll_interval;
  wait.aborted = [this] { return AbortReason(); };
  wait.waiting_for = waiting_for;
  return wait;
}

absl::Status NcclCollectives::Call(ncclResult_t result, const char* what) const {
  // A collective's enqueue ends within microseconds unless it connects to
  // its peers: yielded for, not slept for (PyTorch's short wait, #142291).
  return NcclCallStatus(comm_, result, what,
                        Waiting("a peer: one died or hangs", absl::Milliseconds(1)));
}

template <typename Enqueue>
absl::Status NcclCollectives::Issue(Stream& stream, const char* op, Enqueue&& enqueue) {
  ASSIGN_OR_RETURN(cuda::CudaStream * cuda_stream, CudaStreamOf(stream, op));
  std::lock_guard<std::mutex> lock(mu_);
  if (!failure_.ok()) return failure_;
  absl::Status status = enqueue(cuda_stream->raw());
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
    absl::Status failed(WaitFailureCode(status),
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
    return Call(ncclAllGather(input.address(), output.address(), count, NcclType(dtype), comm_, s),
                "ncclAllGather");
  });
}

absl::Status NcclCollectives::ReduceScatter(Stream& stream, DeviceSpan<const std::byte> input,
                                            DeviceSpan<std::byte> output, size_t count,
                                            DType dtype) {
  RETURN_IF_ERROR(CheckCollectiveSizes("ReduceScatter", input.size(),
                                       count * static_cast<size_t>(size_), output.size(), count,
                                       dtype));
  return Issue(stream, "ncclReduceScatter", [&](cudaStream_t s) {
    return Call(ncclReduceScatter(input.address(), output.address(), count, NcclType(dtype),
                                  ncclSum, comm_, s),
                "ncclReduceScatter");
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
    return Call(ncclReduceScatter(buffer.address(), mine.address(), count, NcclType(dtype), ncclSum,
                                  comm_, s),
                "ncclReduceScatter");
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
      absl::Status created =
          Call(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat32, ncclScalarHostImmediate, comm_),
               "ncclRedOpCreatePreMulSum");
      if (!created.ok()) return created;
    }
    absl::Status issued =
        Call(ncclReduceScatter(r.grad.address(), out.address(), r.count, ncclFloat32, op, comm_, s),
             "ncclReduceScatter");
    // NCCL allows destroying an operator once the calls given it have
    // returned: on this non-blocking communicator, once Call has waited. A
    // failed call leaves the communicator to be aborted, which frees it.
    if (op != ncclSum && issued.ok()) ncclRedOpDestroy(op, comm_);
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
    return Call(ncclAllReduce(buffer.address(), buffer.address(), count, NcclType(dtype),
                              op == ReduceOp::kSum ? ncclSum : ncclMax, comm_, s),
                "ncclAllReduce");
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
    return Call(
        ncclBroadcast(buffer.address(), buffer.address(), count, NcclType(dtype), root, comm_, s),
        "ncclBroadcast");
  });
}

void NcclCollectives::Abort(const std::string& reason) {
  {
    // First, outside mu_: a call waiting on NCCL holds mu_ and ends its wait
    // for this.
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (!abort_reason_.has_value()) abort_reason_ = reason;
  }
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
  // A null config: the new communicator is non-blocking as its parent is.
  // NCCL runs the split as a job of the parent's, whose state follows it,
  // returns ncclSuccess while it runs, and writes `sub` from that job when
  // the split completes (read atomically here): `sub` must outlive the job,
  // which only the parent's abort (below) ends early. Then the new
  // communicator's own state.
  ncclComm_t sub = nullptr;
  const std::atomic_ref<ncclComm_t> written(sub);
  const ncclResult_t started =
      ncclCommSplit(comm_, ranks.front(), static_cast<int>(me - ranks.begin()), &sub, nullptr);
  const PollingWait wait =
      Waiting("every rank of the group to split: one died or hangs", absl::ZeroDuration());
  absl::Status split = NcclCallStatus(comm_, started, "ncclCommSplit", wait);
  if (split.ok()) {
    split = WaitUntil(
        [&]() -> std::optional<absl::Status> {
          if (written.load(std::memory_order_acquire) == nullptr) return std::nullopt;
          return absl::OkStatus();
        },
        "ncclCommSplit", wait);
  }
  if (split.ok()) split = WaitForNccl(sub, "ncclCommSplit", wait);
  if (!split.ok()) {
    absl::Status failed(WaitFailureCode(split),
                        absl::StrCat("nccl rank ", rank_, " of ", size_, ": subgroup '", name,
                                     "': ", split.message()));
    // Aborting the parent ends the split's job and waits for it (it is
    // never used again); only then is `sub` final.
    FailLocked(failed);
    if (ncclComm_t made = written.load(std::memory_order_acquire); made != nullptr) {
      ncclCommAbort(made);
    }
    return failed;
  }
  NcclOptions options = options_;
  options.prefix = absl::StrCat(options_.prefix, "/", name);
  return std::unique_ptr<Collectives>(new NcclCollectives(sub, static_cast<int>(me - ranks.begin()),
                                                          static_cast<int>(ranks.size()), options));
}

}  // namespace flatshard
