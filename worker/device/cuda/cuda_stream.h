// The CUDA device's Stream and Event (worker/device/stream.h): a non-blocking
// cudaStream_t with its own cuBLAS handle, every operation checked with
// stream_checks exactly as the host streams check it (so argument errors are the
// same INVALID_ARGUMENT on every device and nothing is enqueued), then launched
// from cuda_kernels.h. A launch error, a failed synchronization or a failure
// reported from outside (Fail: the NCCL watchdog, worker/comm/nccl_collectives.h)
// becomes the stream's sticky failure: later work is refused with it and
// Synchronize returns it.
//
// Operation bodies live in three files: cuda_stream.cc (ordering, copies,
// casts, the gradient path, GEMM), cuda_stream_layers.cc (layers, attention,
// embeddings) and cuda_stream_training.cc (losses, optimizers, gradient
// clipping).
#ifndef FLATSHARD_WORKER_DEVICE_CUDA_CUDA_STREAM_H_
#define FLATSHARD_WORKER_DEVICE_CUDA_CUDA_STREAM_H_

#include <cstddef>
#include <memory>
#include <mutex>
#include <span>
#include <string>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "worker/device/device.h"
#include "worker/device/stream.h"

namespace flatshard::cuda {

class CudaDevice;

// A stream's first error, shared with the events it records. Set from the
// stream's thread or from a watchdog thread, hence the lock.
class StickyFailure {
 public:
  // Keeps the first error; OK statuses are ignored.
  void Set(const absl::Status& status);
  absl::Status Get() const;

 private:
  mutable std::mutex mu_;
  absl::Status status_;
};

// A cudaEvent_t recorded with timing. Synchronize returns the recording stream's
// failure when that stream has failed by the time the event completes (a
// collective aborted by the NCCL watchdog ends its kernel without a CUDA error,
// so the event alone would look fine); this may also report a failure of work
// issued after the event, which only moves an already failed step's error
// earlier.
class CudaEvent final : public Event {
 public:
  CudaEvent(const CudaDevice* device, cudaEvent_t event, std::shared_ptr<StickyFailure> failure);
  ~CudaEvent() override;
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;

  const CudaDevice* device() const { return device_; }
  cudaEvent_t raw() const { return event_; }
  // The recording stream's failure now (OK if none).
  absl::Status stream_failure() const { return failure_->Get(); }

  absl::Status Synchronize() override;
  absl::StatusOr<double> SecondsSince(const Event& start) const override;

 private:
  const CudaDevice* device_;
  cudaEvent_t event_;
  std::shared_ptr<StickyFailure> failure_;
};

class CudaStream final : public Stream {
 public:
  // For CudaDevice::CreateStream: a non-blocking stream of `priority` on
  // `device` (made current by the caller).
  static absl::StatusOr<std::unique_ptr<CudaStream>> Create(CudaDevice* device, int priority,
                                                            std::string name);
  ~CudaStream() override;

  cudaStream_t raw() const { return stream_; }
  CudaDevice& cuda_device() const;
  // Marks the stream failed with `status` unless it failed already. Thread-safe.
  void Fail(const absl::Status& status) { failure_->Set(status); }
  absl::Status failure() const { return failure_->Get(); }

  absl::StatusOr<std::shared_ptr<Event>> Record() override;
  absl::Status Wait(const Event& event) override;
  absl::Status Synchronize() override;

  absl::Status CopyToDevice(DeviceSpan<std::byte> dst, std::span<const std::byte> src) override;
  absl::Status CopyToHost(std::span<std::byte> dst, DeviceSpan<const std::byte> src) override;
  absl::Status Copy(DeviceSpan<std::byte> dst, DeviceSpan<const std::byte> src) override;
  absl::Status Zero(DeviceSpan<std::byte> dst) override;
  absl::Status Cast(DType src_dtype, DeviceSpan<const std::byte> src, DType dst_dtype,
                    DeviceSpan<std::byte> dst, size_t count) override;
  absl::Status PrepareGradForReduce(DeviceSpan<const float> grad, DType reduce_dtype,
                                    DeviceSpan<std::byte> out, size_t out_count,
                                    double pre_divide) override;
  absl::Status AccumulateReducedGrad(DType reduce_dtype, DeviceSpan<const std::byte> reduced,
                                     DeviceSpan<float> acc, double post_divide) override;
  absl::Status Gemm(const GemmArgs& args) override;

  absl::Status AddBias(DeviceSpan<float> y, DeviceSpan<const float> bias) override;
  absl::Status AccumulateColumnSums(DeviceSpan<const float> x, DeviceSpan<float> out) override;
  absl::Status ActivationForward(Activation kind, DeviceSpan<const float> x,
                                 DeviceSpan<float> y) override;
  absl::Status ActivationBackward(Activation kind, DeviceSpan<const float> saved,
                                  DeviceSpan<const float> dy, DeviceSpan<float> dx) override;
  absl::Status Add(DeviceSpan<float> acc, DeviceSpan<const float> x) override;
  absl::Status AddRowsModulo(DeviceSpan<float> x, DeviceSpan<const float> table,
                             int64_t period) override;
  absl::Status SumRowsModulo(DeviceSpan<const float> x, int64_t period,
                             DeviceSpan<float> out) override;
  absl::Status LayerNormForward(DeviceSpan<const float> x, int64_t dim,
                                DeviceSpan<const float> weight, DeviceSpan<const float> bias,
                                double eps, DeviceSpan<float> y, DeviceSpan<float> xhat,
                                DeviceSpan<float> rstd) override;
  absl::Status LayerNormBackward(DeviceSpan<const float> dy, DeviceSpan<const float> xhat,
                                 DeviceSpan<const float> rstd, DeviceSpan<const float> weight,
                                 DeviceSpan<float> dx, DeviceSpan<float> weight_grad,
                                 DeviceSpan<float> bias_grad) override;
  absl::Status EmbeddingForward(DeviceSpan<const int32_t> ids, DeviceSpan<const float> table,
                                int64_t dim, DeviceSpan<float> out) override;
  absl::Status EmbeddingBackward(DeviceSpan<const int32_t> ids, DeviceSpan<const float> dout,
                                 int64_t dim, DeviceSpan<float> table_grad) override;
  absl::Status SplitHeads(DeviceSpan<const float> rows, const HeadLayout& layout,
                          DeviceSpan<float> heads) override;
  absl::Status MergeHeads(DeviceSpan<const float> heads, const HeadLayout& layout,
                          DeviceSpan<float> rows) override;
  absl::Status CausalSoftmaxForward(DeviceSpan<const float> scores, int64_t seq, float scale,
                                    DeviceSpan<float> probs) override;
  absl::Status CausalSoftmaxBackward(DeviceSpan<const float> probs, DeviceSpan<const float> dprobs,
                                     int64_t seq, float scale, DeviceSpan<float> dscores) override;

  absl::Status MseLoss(DeviceSpan<const float> out, DeviceSpan<const float> target,
                       DeviceSpan<float> grad, DeviceSpan<double> loss) override;
  absl::Status CrossEntropyLoss(DeviceSpan<const float> logits, int64_t classes,
                                DeviceSpan<const int32_t> labels, DeviceSpan<float> grad,
                                DeviceSpan<double> loss) override;
  absl::Status SgdStep(const SgdCoefficients& c, DeviceSpan<float> params,
                       DeviceSpan<const float> grads, DeviceSpan<float> momentum) override;
  absl::Status AdamStep(const AdamCoefficients& c, DeviceSpan<float> params,
                        DeviceSpan<const float> grads, DeviceSpan<float> exp_avg,
                        DeviceSpan<float> exp_avg_sq, DeviceSpan<float> max_exp_avg_sq) override;
  absl::Status GradNormContribution(std::span<const DeviceSpan<const float>> grads,
                                    double norm_type, DeviceSpan<double> out) override;
  absl::Status ClipGrads(std::span<const DeviceSpan<float>> grads, DeviceSpan<const double> reduced,
                         double norm_type, double max_norm) override;

 private:
  CudaStream(CudaDevice* device, std::string name, cudaStream_t stream, cublasHandle_t blas);

  // OK for cudaSuccess; otherwise records "<op>: <what>: <CUDA error>" as the
  // sticky failure and returns it.
  absl::Status Launched(absl::string_view op, absl::string_view what, cudaError_t error);
  absl::Status BlasLaunched(absl::string_view op, cublasStatus_t status);
  // Device memory for one operation's intermediate results, released on this
  // stream (stream-ordered, so after the work that uses it) when it goes out of
  // scope.
  absl::StatusOr<DeviceBuffer> Scratch(size_t bytes);
  // The per-block partial sums of a column sum over `rows` x `cols`
  // (kernels::ColumnSumBlocks).
  absl::StatusOr<DeviceBuffer> ColumnSumScratch(size_t rows, size_t cols);
  // A device-to-device copy of `bytes`; overlapping ranges go through scratch,
  // as cudaMemcpyAsync leaves them undefined and the host's memmove allows them.
  absl::Status CopyBytes(absl::string_view op, void* dst, const void* src, size_t bytes);
  // The cuBLAS workspace, from the pool on first use (Hopper wants 32 MiB).
  absl::Status EnsureBlasWorkspace();

  cudaStream_t stream_;
  cublasHandle_t blas_;
  DeviceBuffer blas_workspace_;
  std::shared_ptr<StickyFailure> failure_ = std::make_shared<StickyFailure>();
};

}  // namespace flatshard::cuda

#endif  // FLATSHARD_WORKER_DEVICE_CUDA_CUDA_STREAM_H_
