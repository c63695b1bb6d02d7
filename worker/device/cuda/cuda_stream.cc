// CudaStream: construction, ordering, copies, casts, the gradient path and
// GEMM. Each operation validates exactly as worker/device/host/host_exec_stream.cc
// does (same checks, same order), then refuses work on a failed stream, then
// enqueues.
#include "worker/device/cuda/cuda_stream.h"

#include <algorithm>
#include <climits>
#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "worker/device/cuda/cublas_api.h"
#include "worker/device/cuda/cuda_device.h"
#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/cuda_status.h"
#include "worker/device/stream_checks.h"

namespace flatshard::cuda {
namespace {

using stream_checks::Check;

// cuBLAS recommends 32 MiB of workspace on Hopper (4 MiB before it).
constexpr size_t kBlasWorkspaceBytes = size_t{32} << 20;

bool Overlap(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto* pa = static_cast<const std::byte*>(a);
  const auto* pb = static_cast<const std::byte*>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

bool FitsInt(int64_t value) { return value <= INT_MAX; }

}  // namespace

// ---- StickyFailure and CudaEvent

void StickyFailure::Set(const absl::Status& status) {
  if (status.ok()) return;
  std::lock_guard<std::mutex> lock(mu_);
  if (status_.ok()) status_ = status;
}

absl::Status StickyFailure::Get() const {
  std::lock_guard<std::mutex> lock(mu_);
  return status_;
}

CudaEvent::CudaEvent(const CudaDevice* device, cudaEvent_t event,
                     std::shared_ptr<StickyFailure> failure)
    : device_(device), event_(event), failure_(std::move(failure)) {}

CudaEvent::~CudaEvent() {
  // Safe while the event is pending or waited on: CUDA releases it once done.
  if (cudaEventDestroy(event_) != cudaSuccess) (void)cudaGetLastError();
}

absl::Status CudaEvent::Synchronize() {
  if (const cudaError_t error = cudaEventSynchronize(event_); error != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(error, "Event::Synchronize: cudaEventSynchronize");
  }
  return failure_->Get();
}

absl::StatusOr<double> CudaEvent::SecondsSince(const Event& start) const {
  const auto* begin = dynamic_cast<const CudaEvent*>(&start);
  if (begin == nullptr || begin->device_ != device_) {
    return absl::InvalidArgumentError(
        "Event::SecondsSince: the start event was not recorded on this CUDA device");
  }
  float milliseconds = 0.0f;
  const cudaError_t error = cudaEventElapsedTime(&milliseconds, begin->event_, event_);
  if (error == cudaErrorNotReady) {
    (void)cudaGetLastError();
    return absl::FailedPreconditionError(
        "Event::SecondsSince: an event has not completed (Synchronize it first)");
  }
  if (error != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(error, "Event::SecondsSince: cudaEventElapsedTime");
  }
  return static_cast<double>(milliseconds) / 1000.0;
}

// ---- construction

CudaStream::CudaStream(CudaDevice* device, std::string name, cudaStream_t stream,
                       cublasHandle_t blas)
    : Stream(device, std::move(name)), stream_(stream), blas_(blas) {}

absl::StatusOr<std::unique_ptr<CudaStream>> CudaStream::Create(CudaDevice* device, int priority,
                                                               std::string name) {
  cudaStream_t stream = nullptr;
  if (const cudaError_t error =
          cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, priority);
      error != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(error,
                      absl::StrCat("stream '", name, "': cudaStreamCreateWithPriority").c_str());
  }
  cublasHandle_t blas = nullptr;
  cublasStatus_t status = Cublas().Create(&blas);
  // The stream's own handle on the stream; default math (no TF32), so SGEMM
  // rounds as the host's float32 BLAS does.
  if (status == CUBLAS_STATUS_SUCCESS) status = Cublas().SetStream(blas, stream);
  if (status == CUBLAS_STATUS_SUCCESS) status = Cublas().SetMathMode(blas, CUBLAS_DEFAULT_MATH);
  if (status != CUBLAS_STATUS_SUCCESS) {
    if (blas != nullptr) Cublas().Destroy(blas);
    cudaStreamDestroy(stream);
    (void)cudaGetLastError();
    return absl::InternalError(
        absl::StrCat("stream '", name, "': setting up cuBLAS: ", Cublas().GetStatusString(status)));
  }
  return std::unique_ptr<CudaStream>(new CudaStream(device, std::move(name), stream, blas));
}

CudaStream::~CudaStream() {
  ScopedDevice current(cuda_device().ordinal());
  blas_workspace_.Release(*this);  // enqueued before the stream goes away
  Cublas().Destroy(blas_);
  // Returns at once; CUDA releases the stream when its work is done.
  cudaStreamDestroy(stream_);
  (void)cudaGetLastError();
}

CudaDevice& CudaStream::cuda_device() const { return static_cast<CudaDevice&>(device()); }

// ---- helpers

absl::Status CudaStream::Launched(absl::string_view op, absl::string_view what, cudaError_t error) {
  if (error == cudaSuccess) return absl::OkStatus();
  (void)cudaGetLastError();
  Fail(CudaStatus(error, absl::StrCat(op, " on stream '", name(), "': ", what).c_str()));
  return failure();
}

absl::Status CudaStream::BlasLaunched(absl::string_view op, cublasStatus_t status) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  (void)cudaGetLastError();
  Fail(absl::InternalError(
      absl::StrCat(op, " on stream '", name(), "': cuBLAS: ", Cublas().GetStatusString(status))));
  return failure();
}

absl::StatusOr<DeviceBuffer> CudaStream::Scratch(size_t bytes) {
  return device().Allocate(bytes, *this, MemoryKind::kActivations, /*tracker=*/nullptr);
}

absl::Status CudaStream::CopyBytes(absl::string_view op, void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return absl::OkStatus();
  if (!Overlap(dst, bytes, src, bytes)) {
    return Launched(op, "cudaMemcpyAsync",
                    cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, stream_));
  }
  ASSIGN_OR_RETURN(DeviceBuffer staging, Scratch(bytes));
  void* through = staging.byte_span().address();
  RETURN_IF_ERROR(Launched(op, "cudaMemcpyAsync",
                           cudaMemcpyAsync(through, src, bytes, cudaMemcpyDefault, stream_)));
  return Launched(op, "cudaMemcpyAsync",
                  cudaMemcpyAsync(dst, through, bytes, cudaMemcpyDefault, stream_));
}

absl::Status CudaStream::EnsureBlasWorkspace() {
  if (blas_workspace_.allocated()) return absl::OkStatus();
  ASSIGN_OR_RETURN(DeviceBuffer workspace, Scratch(kBlasWorkspaceBytes));
  RETURN_IF_ERROR(BlasLaunched(
      "Gemm", Cublas().SetWorkspace(blas_, workspace.byte_span().address(), kBlasWorkspaceBytes)));
  blas_workspace_ = std::move(workspace);
  return absl::OkStatus();
}

// ---- ordering

absl::StatusOr<std::shared_ptr<Event>> CudaStream::Record() {
  ScopedDevice current(cuda_device().ordinal());
  RETURN_IF_ERROR(current.status());
  cudaEvent_t event = nullptr;
  if (const cudaError_t error = cudaEventCreate(&event); error != cudaSuccess) {
    (void)cudaGetLastError();
    return CudaStatus(error,
                      absl::StrCat("Record on stream '", name(), "': cudaEventCreate").c_str());
  }
  if (const cudaError_t error = cudaEventRecord(event, stream_); error != cudaSuccess) {
    cudaEventDestroy(event);
    return Launched("Record", "cudaEventRecord", error);
  }
  return std::shared_ptr<Event>(std::make_shared<CudaEvent>(&cuda_device(), event, failure_));
}

absl::Status CudaStream::Wait(const Event& event) {
  const auto* cuda_event = dynamic_cast<const CudaEvent*>(&event);
  if (cuda_event == nullptr || cuda_event->device() != &cuda_device()) {
    return absl::InvalidArgumentError(
        absl::StrCat("stream '", name(), "' cannot wait on an event of another device"));
  }
  RETURN_IF_ERROR(failure());
  // Work after a failed event would read what the failed work did not write.
  if (absl::Status upstream = cuda_event->stream_failure(); !upstream.ok()) {
    Fail(upstream);
    return failure();
  }
  return Launched("Wait", "cudaStreamWaitEvent",
                  cudaStreamWaitEvent(stream_, cuda_event->raw(), 0));
}

absl::Status CudaStream::Synchronize() {
  if (const cudaError_t error = cudaStreamSynchronize(stream_); error != cudaSuccess) {
    (void)cudaGetLastError();
    Fail(CudaStatus(
        error,
        absl::StrCat("Synchronize on stream '", name(), "': cudaStreamSynchronize").c_str()));
  }
  return failure();
}

// ---- copies

absl::Status CudaStream::CopyToDevice(DeviceSpan<std::byte> dst, std::span<const std::byte> src) {
  RETURN_IF_ERROR(
      Check(dst.size() == src.size(), "CopyToDevice", "source and target sizes differ"));
  RETURN_IF_ERROR(failure());
  if (src.empty()) return absl::OkStatus();
  // Pageable sources are staged before cudaMemcpyAsync returns; pinned ones are
  // copied asynchronously (the Stream contract for host memory).
  return Launched(
      "CopyToDevice", "cudaMemcpyAsync",
      cudaMemcpyAsync(dst.address(), src.data(), src.size(), cudaMemcpyDefault, stream_));
}

absl::Status CudaStream::CopyToHost(std::span<std::byte> dst, DeviceSpan<const std::byte> src) {
  RETURN_IF_ERROR(Check(dst.size() == src.size(), "CopyToHost", "source and target sizes differ"));
  RETURN_IF_ERROR(failure());
  if (src.empty()) return absl::OkStatus();
  // Into pageable memory cudaMemcpyAsync returns once the copy is done.
  return Launched(
      "CopyToHost", "cudaMemcpyAsync",
      cudaMemcpyAsync(dst.data(), src.address(), src.size(), cudaMemcpyDefault, stream_));
}

absl::Status CudaStream::Copy(DeviceSpan<std::byte> dst, DeviceSpan<const std::byte> src) {
  RETURN_IF_ERROR(Check(dst.size() == src.size(), "Copy", "source and target sizes differ"));
  RETURN_IF_ERROR(failure());
  return CopyBytes("Copy", dst.address(), src.address(), src.size());
}

absl::Status CudaStream::Zero(DeviceSpan<std::byte> dst) {
  RETURN_IF_ERROR(failure());
  if (dst.empty()) return absl::OkStatus();
  return Launched("Zero", "cudaMemsetAsync",
                  cudaMemsetAsync(dst.address(), 0, dst.size(), stream_));
}

// ---- mixed precision and the gradient path

absl::Status CudaStream::Cast(DType src_dtype, DeviceSpan<const std::byte> src, DType dst_dtype,
                              DeviceSpan<std::byte> dst, size_t count) {
  RETURN_IF_ERROR(stream_checks::CheckCast(src_dtype, src, dst_dtype, dst, count));
  RETURN_IF_ERROR(failure());
  if (count == 0) return absl::OkStatus();
  const size_t src_bytes = count * DTypeSize(src_dtype), dst_bytes = count * DTypeSize(dst_dtype);
  if (src_dtype == dst_dtype) return CopyBytes("Cast", dst.address(), src.address(), src_bytes);
  if (!Overlap(dst.address(), dst_bytes, src.address(), src_bytes)) {
    return Launched("Cast", "kernel launch",
                    LaunchCast(src_dtype, src.address(), dst_dtype, dst.address(), count, stream_));
  }
  // In place (or overlapping): the host's sequential loop allows it, parallel
  // threads would race, so cast into scratch and copy.
  ASSIGN_OR_RETURN(DeviceBuffer staging, Scratch(dst_bytes));
  RETURN_IF_ERROR(Launched("Cast", "kernel launch",
                           LaunchCast(src_dtype, src.address(), dst_dtype,
                                      staging.byte_span().address(), count, stream_)));
  return CopyBytes("Cast", dst.address(), staging.byte_span().address(), dst_bytes);
}

absl::Status CudaStream::PrepareGradForReduce(DeviceSpan<const float> grad, DType reduce_dtype,
                                              DeviceSpan<std::byte> out, size_t out_count,
                                              double pre_divide) {
  RETURN_IF_ERROR(stream_checks::CheckPrepareGrad(grad, reduce_dtype, out, out_count));
  RETURN_IF_ERROR(failure());
  const auto pre = static_cast<float>(pre_divide);
  const size_t out_bytes = out_count * DTypeSize(reduce_dtype);
  // Element i reads grad[i] and writes out[i]: in place is safe for equal
  // element sizes at the same address, anything else overlapping goes through
  // scratch.
  const bool same_elements =
      static_cast<const void*>(grad.address()) == static_cast<const void*>(out.address()) &&
      DTypeSize(reduce_dtype) == sizeof(float);
  if (same_elements || !Overlap(out.address(), out_bytes, grad.address(), grad.size_bytes())) {
    return Launched("PrepareGradForReduce", "kernel launch",
                    LaunchPrepareGradForReduce(grad.address(), grad.size(), reduce_dtype,
                                               out.address(), out_count, pre, stream_));
  }
  ASSIGN_OR_RETURN(DeviceBuffer staging, Scratch(out_bytes));
  RETURN_IF_ERROR(
      Launched("PrepareGradForReduce", "kernel launch",
               LaunchPrepareGradForReduce(grad.address(), grad.size(), reduce_dtype,
                                          staging.byte_span().address(), out_count, pre, stream_)));
  return CopyBytes("PrepareGradForReduce", out.address(), staging.byte_span().address(), out_bytes);
}

absl::Status CudaStream::AccumulateReducedGrad(DType reduce_dtype,
                                               DeviceSpan<const std::byte> reduced,
                                               DeviceSpan<float> acc, double post_divide) {
  RETURN_IF_ERROR(stream_checks::CheckAccumulateReduced(reduce_dtype, reduced, acc));
  RETURN_IF_ERROR(failure());
  return Launched(
      "AccumulateReducedGrad", "kernel launch",
      LaunchAccumulateReducedGrad(reduce_dtype, reduced.address(), acc.address(), acc.size(),
                                  static_cast<float>(post_divide), stream_));
}

// ---- GEMM

absl::Status CudaStream::Gemm(const GemmArgs& g) {
  RETURN_IF_ERROR(stream_checks::CheckGemm(g));
  RETURN_IF_ERROR(Check(FitsInt(g.m) && FitsInt(g.n) && FitsInt(g.k) && FitsInt(g.lda) &&
                            FitsInt(g.ldb) && FitsInt(g.ldc) && FitsInt(g.batch),
                        "Gemm", "cuBLAS takes dimensions and row strides below 2^31"));
  RETURN_IF_ERROR(failure());
  if (g.m == 0 || g.n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(EnsureBlasWorkspace());
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: cuBLAS sees
  // each row-major operand as its column-major transpose, so B comes first with
  // its own op and the m/n roles swap. With k = 0 nothing is read from A or B
  // (C = beta C, as the host's BLAS computes), but cuBLAS still wants row
  // strides of at least 1.
  const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = std::max(1, static_cast<int>(g.lda));
  const int ldb = std::max(1, static_cast<int>(g.ldb));
  const int ldc = static_cast<int>(g.ldc);
  // Output matrices that overlap one another (stride_c below C's extent) are
  // written one after another, as the host's loop writes them.
  const int64_t c_extent = (g.m - 1) * g.ldc + g.n;
  if (g.batch > 1 && g.stride_c < c_extent) {
    for (int64_t i = 0; i < g.batch; ++i) {
      RETURN_IF_ERROR(BlasLaunched(
          "Gemm",
          Cublas().Sgemm(blas_, op_b, op_a, n, m, k, &g.alpha, g.b.address() + i * g.stride_b, ldb,
                         g.a.address() + i * g.stride_a, lda, &g.beta,
                         g.c.address() + i * g.stride_c, ldc)));
    }
    return absl::OkStatus();
  }
  return BlasLaunched("Gemm", Cublas().SgemmStridedBatched(
                                  blas_, op_b, op_a, n, m, k, &g.alpha, g.b.address(), ldb,
                                  g.stride_b, g.a.address(), lda, g.stride_a, &g.beta,
                                  g.c.address(), ldc, g.stride_c, static_cast<int>(g.batch)));
}

}  // namespace flatshard::cuda
