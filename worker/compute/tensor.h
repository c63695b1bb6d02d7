// The activation tensor the layer library passes between layers: a row-major
// float32 matrix in device memory (worker/device/device.h). Token models flatten
// [batch, seq_len] into rows. A Tensor owns its buffer; layers create them with
// the helpers below on the model's DeviceContext and never read their elements
// on the host (TensorToHost copies, for tests and for what leaves the device).
#ifndef FLATSHARD_WORKER_COMPUTE_TENSOR_H_
#define FLATSHARD_WORKER_COMPUTE_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

#include "worker/device/device.h"
#include "worker/device/memory_tracker.h"

namespace flatshard::compute {

// Where a model's tensors live and its kernels run: the compute stream of the
// worker's device. Activations are charged to `memory` (may be null).
struct DeviceContext {
  Device* device = nullptr;
  Stream* stream = nullptr;
  MemoryTracker* memory = nullptr;
};

struct Tensor {  // row-major [rows, cols] float32
  int64_t rows = 0, cols = 0;
  // Shared only through SaveForBackward; otherwise a tensor is its buffer's one
  // owner (move-only).
  std::shared_ptr<DeviceBuffer> buffer;

  Tensor() = default;
  Tensor(Tensor&&) = default;
  Tensor& operator=(Tensor&&) = default;
  Tensor(const Tensor&) = delete;
  Tensor& operator=(const Tensor&) = delete;

  size_t size() const { return static_cast<size_t>(rows * cols); }
  bool empty() const { return size() == 0; }
  size_t capacity_bytes() const { return buffer == nullptr ? 0 : buffer->bytes(); }
  DeviceSpan<float> span() const {
    return buffer == nullptr ? DeviceSpan<float>() : buffer->span<float>().first(size());
  }
};

// [rows, cols] with undefined contents (for outputs a kernel writes whole).
absl::StatusOr<Tensor> NewTensor(const DeviceContext& ctx, int64_t rows, int64_t cols);
// [rows, cols] of zeros.
absl::StatusOr<Tensor> ZeroTensor(const DeviceContext& ctx, int64_t rows, int64_t cols);
// A copy of `t`.
absl::StatusOr<Tensor> CloneTensor(const DeviceContext& ctx, const Tensor& t);
// A second handle on `t`'s storage, for a layer that keeps its input for the
// backward pass (autograd's saved tensors) without copying it. Sound because
// nothing writes a layer's input after the layer ran: every layer writes only
// the fresh outputs it allocates, and the one in-place write (Residual adds the
// skip into its chain's output) targets a tensor no layer saved (ReLU, which
// saves its output, saves a copy for that reason).
Tensor SaveForBackward(const Tensor& t);
// [rows, cols] from host values (rows * cols of them).
absl::StatusOr<Tensor> TensorFromHost(const DeviceContext& ctx, int64_t rows, int64_t cols,
                                      std::span<const float> values);
// The values of `t` on the host; waits for the stream.
absl::StatusOr<std::vector<float>> TensorToHost(const DeviceContext& ctx, const Tensor& t);

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_TENSOR_H_
