#include "worker/compute/tensor.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard::compute {

absl::StatusOr<Tensor> NewTensor(const DeviceContext& ctx, int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor shape [", rows, ", ", cols, "] is negative"));
  }
  Tensor t;
  t.rows = rows;
  t.cols = cols;
  ASSIGN_OR_RETURN(DeviceBuffer buffer, ctx.device->Allocate(t.size() * sizeof(float), *ctx.stream,
                                                             MemoryKind::kActivations, ctx.memory));
  t.buffer = std::make_shared<DeviceBuffer>(std::move(buffer));
  return t;
}

Tensor SaveForBackward(const Tensor& t) {
  Tensor saved;
  saved.rows = t.rows;
  saved.cols = t.cols;
  saved.buffer = t.buffer;
  return saved;
}

absl::StatusOr<Tensor> ZeroTensor(const DeviceContext& ctx, int64_t rows, int64_t cols) {
  ASSIGN_OR_RETURN(Tensor t, NewTensor(ctx, rows, cols));
  RETURN_IF_ERROR(ctx.stream->Zero(AsWritableBytes(t.span())));
  return t;
}

absl::StatusOr<Tensor> CloneTensor(const DeviceContext& ctx, const Tensor& t) {
  ASSIGN_OR_RETURN(Tensor copy, NewTensor(ctx, t.rows, t.cols));
  RETURN_IF_ERROR(ctx.stream->Copy(AsWritableBytes(copy.span()), AsBytes(t.span())));
  return copy;
}

absl::StatusOr<Tensor> TensorFromHost(const DeviceContext& ctx, int64_t rows, int64_t cols,
                                      std::span<const float> values) {
  ASSIGN_OR_RETURN(Tensor t, NewTensor(ctx, rows, cols));
  if (values.size() != t.size()) {
    return absl::InvalidArgumentError(absl::StrCat("tensor [", rows, ", ", cols, "] needs ",
                                                   t.size(), " values, got ", values.size()));
  }
  RETURN_IF_ERROR(ctx.stream->CopyToDevice(AsWritableBytes(t.span()), std::as_bytes(values)));
  return t;
}

absl::StatusOr<std::vector<float>> TensorToHost(const DeviceContext& ctx, const Tensor& t) {
  std::vector<float> values(t.size());
  RETURN_IF_ERROR(
      ctx.stream->CopyToHost(std::as_writable_bytes(std::span<float>(values)), AsBytes(t.span())));
  RETURN_IF_ERROR(ctx.stream->Synchronize());
  return values;
}

}  // namespace flatshard::compute
