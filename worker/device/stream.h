// Streams and events: the one way work reaches a device (modelled on CUDA streams
// and PyTorch's c10 Stream/Event). A Stream is an ordered queue of copies, kernels
// and collectives; work on one stream runs in issue order, work on two streams is
// unordered unless one waits on an Event the other recorded. Every kernel the
// layers, the FSDP units, the losses and the optimizers need is an operation here,
// so the runtime is written once against this interface and runs on every device
// (docs/architecture.md §5):
//   - CPU device: the compute stream runs each operation inline on the calling
//     thread; other streams run on a thread each (the communication lane).
//   - simulated device: every stream runs on its own thread with random delays,
//     and an operation touching a buffer whose last producer on another stream was
//     not waited for is refused with an error naming both (worker/device/sim/).
//   - CUDA device: cudaStream_t, kernels, cuBLAS, NCCL.
//
// Contract for every operation: spans are DeviceSpans of this stream's device
// (host memory only where the parameter is a std::span). The operation is checked
// and enqueued; argument errors come back at once as INVALID_ARGUMENT and nothing
// is enqueued. Errors while the work runs are sticky: the stream refuses later
// work and Synchronize (or an Event recorded after it) returns the first error.
// Outputs are written whole unless the comment says "accumulates". A stream is
// used by one host thread at a time.
#ifndef FLATSHARD_WORKER_DEVICE_STREAM_H_
#define FLATSHARD_WORKER_DEVICE_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#include "core/dtype.h"
#include "core/optimizer_update.h"
#include "worker/device/device_span.h"

namespace flatshard {

class Device;

// A point in a stream's work. Recorded by Stream::Record; copyable handles share it.
class Event {
 public:
  virtual ~Event() = default;
  // Blocks the calling thread until the work before the event has run; the first
  // error of that work, if any.
  virtual absl::Status Synchronize() = 0;
  // Seconds of device time between `start` and this event, both recorded on the
  // same device with timing and both complete (Synchronize first).
  virtual absl::StatusOr<double> SecondsSince(const Event& start) const = 0;
};

enum class Activation { kRelu, kGeluErf, kGeluTanh };

// Row-major C[m, n] = alpha * op(A)[m, k] * op(B)[k, n] + beta * C, `batch` times
// with element strides between consecutive matrices. op(A) = A^T when trans_a (A
// is then stored [k, m]); lda/ldb/ldc are row strides in elements.
struct GemmArgs {
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.0f;
  float beta = 0.0f;
  DeviceSpan<const float> a;
  int64_t lda = 0;
  DeviceSpan<const float> b;
  int64_t ldb = 0;
  DeviceSpan<float> c;
  int64_t ldc = 0;
  int64_t batch = 1;
  int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

// Attention's [batch, seq, heads, head_dim] slice of a row-major activation whose
// rows are (batch, seq) and whose columns [col_offset, col_offset + heads*head_dim)
// hold the heads, and its [batch, heads, seq, head_dim] contiguous form.
struct HeadLayout {
  int64_t batch = 0, seq = 0, heads = 0, head_dim = 0;
  int64_t row_stride = 0;  // columns of the row-major activation
  int64_t col_offset = 0;
  int64_t elements() const { return batch * seq * heads * head_dim; }
};

class Stream {
 public:
  virtual ~Stream() = default;
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  Device& device() const { return *device_; }
  const std::string& name() const { return name_; }

  // ---- ordering
  // An event that completes when everything issued so far on this stream has.
  virtual absl::StatusOr<std::shared_ptr<Event>> Record() = 0;
  // Work issued after this call starts only once `event` completed. On a stream
  // that runs inline this blocks the caller; an event recorded on another device
  // is INVALID_ARGUMENT.
  virtual absl::Status Wait(const Event& event) = 0;
  // Blocks until everything issued so far has run; the stream's first error.
  virtual absl::Status Synchronize() = 0;

  // ---- copies. Host memory from Device::AllocatePinned is copied asynchronously
  // (keep it untouched until the copy is known complete); any other host memory
  // is copied before the call returns, as CUDA does for pageable memory.
  virtual absl::Status CopyToDevice(DeviceSpan<std::byte> dst, std::span<const std::byte> src) = 0;
  virtual absl::Status CopyToHost(std::span<std::byte> dst, DeviceSpan<const std::byte> src) = 0;
  virtual absl::Status Copy(DeviceSpan<std::byte> dst, DeviceSpan<const std::byte> src) = 0;
  virtual absl::Status Zero(DeviceSpan<std::byte> dst) = 0;

  // ---- mixed precision and the FSDP gradient path (docs/fsdp-semantics.md §3-4)
  // `count` elements of src converted to dst_dtype: float32 <-> bfloat16/float16
  // (round to nearest even) or a copy for equal dtypes.
  virtual absl::Status Cast(DType src_dtype, DeviceSpan<const std::byte> src, DType dst_dtype,
                            DeviceSpan<std::byte> dst, size_t count) = 0;
  // The reduce-scatter input of §3.2 in one pass: out[i] = reduce_dtype(grad[i]) /
  // pre_divide (divided in reduce_dtype) for i < grad.size(), 0 up to out_count.
  virtual absl::Status PrepareGradForReduce(DeviceSpan<const float> grad, DType reduce_dtype,
                                            DeviceSpan<std::byte> out, size_t out_count,
                                            double pre_divide) = 0;
  // Accumulates the reduced shard into the fp32 gradient shard (§3.2, §3.5):
  // acc[i] += float32(reduce_dtype(reduced[i]) / post_divide).
  virtual absl::Status AccumulateReducedGrad(DType reduce_dtype,
                                             DeviceSpan<const std::byte> reduced,
                                             DeviceSpan<float> acc, double post_divide) = 0;

  // ---- dense layers
  virtual absl::Status Gemm(const GemmArgs& args) = 0;
  // y[r, :] += bias for every row of y[rows, bias.size()].
  virtual absl::Status AddBias(DeviceSpan<float> y, DeviceSpan<const float> bias) = 0;
  // Accumulates column sums: out[c] += sum over rows of x[rows, out.size()],
  // added in the order of kernels::ColumnSumBlocks (element_ops.h) on every
  // device.
  virtual absl::Status AccumulateColumnSums(DeviceSpan<const float> x, DeviceSpan<float> out) = 0;
  virtual absl::Status ActivationForward(Activation kind, DeviceSpan<const float> x,
                                         DeviceSpan<float> y) = 0;
  // dx = dy * f'(.) from what the forward saved: its input for GELU, its output
  // for ReLU (whose gradient at 0 is 0, as torch's).
  virtual absl::Status ActivationBackward(Activation kind, DeviceSpan<const float> saved,
                                          DeviceSpan<const float> dy, DeviceSpan<float> dx) = 0;
  // acc += x, elementwise.
  virtual absl::Status Add(DeviceSpan<float> acc, DeviceSpan<const float> x) = 0;
  // x[r, :] += table[r % period, :] for x[rows, cols] (cols = table.size() / period).
  virtual absl::Status AddRowsModulo(DeviceSpan<float> x, DeviceSpan<const float> table,
                                     int64_t period) = 0;
  // out[t, :] = sum of x[r, :] over r % period == t, for x[rows, cols].
  virtual absl::Status SumRowsModulo(DeviceSpan<const float> x, int64_t period,
                                     DeviceSpan<float> out) = 0;

  // ---- LayerNorm over the last dimension of x[rows, dim]; weight and bias may be
  // empty (elementwise_affine off). Forward saves xhat and rstd for backward,
  // whose weight/bias grads (when not empty) accumulate.
  virtual absl::Status LayerNormForward(DeviceSpan<const float> x, int64_t dim,
                                        DeviceSpan<const float> weight,
                                        DeviceSpan<const float> bias, double eps,
                                        DeviceSpan<float> y, DeviceSpan<float> xhat,
                                        DeviceSpan<float> rstd) = 0;
  virtual absl::Status LayerNormBackward(DeviceSpan<const float> dy, DeviceSpan<const float> xhat,
                                         DeviceSpan<const float> rstd,
                                         DeviceSpan<const float> weight, DeviceSpan<float> dx,
                                         DeviceSpan<float> weight_grad,
                                         DeviceSpan<float> bias_grad) = 0;

  // ---- Embedding: out[i, :] = table[ids[i], :]; ids must be in range (callers
  // validate them on the host). Backward accumulates table_grad[ids[i], :] +=
  // dout[i, :] in a deterministic order (row order per id).
  virtual absl::Status EmbeddingForward(DeviceSpan<const int32_t> ids,
                                        DeviceSpan<const float> table, int64_t dim,
                                        DeviceSpan<float> out) = 0;
  virtual absl::Status EmbeddingBackward(DeviceSpan<const int32_t> ids,
                                         DeviceSpan<const float> dout, int64_t dim,
                                         DeviceSpan<float> table_grad) = 0;

  // ---- causal self-attention pieces
  // dst[b, h, t, :] = rows[(b*seq + t), col_offset + h*head_dim : ...]
  virtual absl::Status SplitHeads(DeviceSpan<const float> rows, const HeadLayout& layout,
                                  DeviceSpan<float> heads) = 0;
  // The inverse: writes those columns of `rows` from heads [batch, heads, seq, head_dim].
  virtual absl::Status MergeHeads(DeviceSpan<const float> heads, const HeadLayout& layout,
                                  DeviceSpan<float> rows) = 0;
  // For `matrices` row-major [seq, seq] score matrices: probs[t, :] = softmax over
  // t2 <= t of scores[t, t2] * scale, 0 for t2 > t (the causal mask).
  virtual absl::Status CausalSoftmaxForward(DeviceSpan<const float> scores, int64_t seq,
                                            float scale, DeviceSpan<float> probs) = 0;
  // dscores = scale * probs * (dprobs - sum_t2(probs * dprobs)) row by row.
  virtual absl::Status CausalSoftmaxBackward(DeviceSpan<const float> probs,
                                             DeviceSpan<const float> dprobs, int64_t seq,
                                             float scale, DeviceSpan<float> dscores) = 0;

  // ---- losses: loss[0] = the mean loss (torch's default reduction), grad = its
  // gradient with respect to the output. Cross-entropy rows are out.size()/classes;
  // labels must be in range (callers validate them on the host).
  virtual absl::Status MseLoss(DeviceSpan<const float> out, DeviceSpan<const float> target,
                               DeviceSpan<float> grad, DeviceSpan<double> loss) = 0;
  virtual absl::Status CrossEntropyLoss(DeviceSpan<const float> logits, int64_t classes,
                                        DeviceSpan<const int32_t> labels, DeviceSpan<float> grad,
                                        DeviceSpan<double> loss) = 0;

  // ---- optimizers, one fused pass over a shard (core/optimizer_update.h).
  // `momentum` is empty without momentum; `max_exp_avg_sq` without amsgrad.
  virtual absl::Status SgdStep(const SgdCoefficients& c, DeviceSpan<float> params,
                               DeviceSpan<const float> grads, DeviceSpan<float> momentum) = 0;
  virtual absl::Status AdamStep(const AdamCoefficients& c, DeviceSpan<float> params,
                                DeviceSpan<const float> grads, DeviceSpan<float> exp_avg,
                                DeviceSpan<float> exp_avg_sq, DeviceSpan<float> max_exp_avg_sq) = 0;

  // ---- clip_grad_norm_ (docs/fsdp-semantics.md §8) without leaving the device.
  // out[0] = this rank's contribution over the gradient tensors (each one FSDP
  // flat-parameter shard): the float32-rounded sum of per-tensor norms raised to p
  // for finite p, max |g| for p = inf (core/clip_grad_norm_math.h).
  virtual absl::Status GradNormContribution(std::span<const DeviceSpan<const float>> grads,
                                            double norm_type, DeviceSpan<double> out) = 0;
  // Scales every gradient by ClipCoefficient(max_norm, TotalNorm(reduced[0], 0, p)):
  // `reduced` is the contribution after the all-reduce over the shard group.
  virtual absl::Status ClipGrads(std::span<const DeviceSpan<float>> grads,
                                 DeviceSpan<const double> reduced, double norm_type,
                                 double max_norm) = 0;

 protected:
  Stream(Device* device, std::string name) : device_(device), name_(std::move(name)) {}

 private:
  Device* device_;
  std::string name_;
};

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_STREAM_H_
