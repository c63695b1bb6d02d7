// A Stream whose operations run as host functions (host_kernels.h) over host
// memory: the streams of the CPU device and of the simulated device. Every
// operation is written here once: it validates its arguments, lists the device
// memory it reads and writes, and hands a closure to Submit, which each concrete
// stream implements:
//   - the CPU device's compute stream runs it at once on the calling thread,
//   - the CPU device's other streams queue it to their thread,
//   - the simulated device checks the accesses against every stream's event
//     history, translates the addresses and queues it, after a random delay,
//     to the stream's thread (worker/device/sim/sim_device.h).
#ifndef FLATSHARD_WORKER_DEVICE_HOST_HOST_EXEC_STREAM_H_
#define FLATSHARD_WORKER_DEVICE_HOST_HOST_EXEC_STREAM_H_

#include <array>
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "worker/device/stream.h"

namespace flatshard {

// One memory range an operation touches.
struct MemoryAccess {
  const void* address = nullptr;  // device address, or host address when `host`
  size_t bytes = 0;
  bool write = false;
  bool host = false;  // host memory (a copy's source or target)
};

// The host pointers of an operation's accesses, in the order they were listed.
class ResolvedAccesses {
 public:
  explicit ResolvedAccesses(std::vector<void*> pointers) : pointers_(std::move(pointers)) {}
  template <typename T>
  T* get(size_t index) const {
    return static_cast<T*>(pointers_[index]);
  }

 private:
  std::vector<void*> pointers_;
};

class HostExecStream : public Stream {
 public:
  using Work = std::function<absl::Status(const ResolvedAccesses&)>;

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

  // Runs `work` in this stream's order with the host pointers of `accesses`. The
  // operation is named `op` in errors (the sim's race reports name both ends).
  // Collectives over host-executed streams (worker/comm/host_collectives.h) come
  // through here too.
  virtual absl::Status Submit(absl::string_view op, std::vector<MemoryAccess> accesses,
                              Work work) = 0;

 protected:
  using Stream::Stream;
};

// Access builders.
template <typename T>
MemoryAccess ReadOf(DeviceSpan<T> span) {
  return {span.address(), span.size_bytes(), false, false};
}
template <typename T>
MemoryAccess WriteOf(DeviceSpan<T> span) {
  return {span.address(), span.size_bytes(), true, false};
}

}  // namespace flatshard

#endif  // FLATSHARD_WORKER_DEVICE_HOST_HOST_EXEC_STREAM_H_
