// CudaStream: dense-layer pieces, LayerNorm, embeddings and attention. Checks
// and argument mapping follow worker/device/host/host_exec_stream.cc line for
// line, so both devices accept and refuse the same calls.
#include <algorithm>
#include <climits>
#include <cstdint>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "worker/device/cuda/cuda_kernels.h"
#include "worker/device/cuda/cuda_stream.h"
#include "worker/device/kernels/element_ops.h"
#include "worker/device/stream_checks.h"

namespace flatshard::cuda {
namespace {

using stream_checks::Check;

size_t Count(int64_t n) { return static_cast<size_t>(n); }

constexpr absl::string_view kLaunch = "kernel launch";

}  // namespace

absl::StatusOr<DeviceBuffer> CudaStream::ColumnSumScratch(size_t rows, size_t cols) {
  // At least one float: a pool allocation of zero bytes is refused.
  return Scratch(std::max<size_t>(kernels::ColumnSumBlocks(rows) * cols, 1) * sizeof(float));
}

absl::Status CudaStream::AddBias(DeviceSpan<float> y, DeviceSpan<const float> bias) {
  RETURN_IF_ERROR(stream_checks::CheckRows("AddBias", y.size(), bias.size()));
  RETURN_IF_ERROR(failure());
  const size_t cols = bias.size(), rows = cols == 0 ? 0 : y.size() / cols;
  return Launched("AddBias", kLaunch,
                  LaunchAddBias(y.address(), rows, bias.address(), cols, raw()));
}

absl::Status CudaStream::AccumulateColumnSums(DeviceSpan<const float> x, DeviceSpan<float> out) {
  RETURN_IF_ERROR(stream_checks::CheckRows("AccumulateColumnSums", x.size(), out.size()));
  RETURN_IF_ERROR(failure());
  const size_t cols = out.size(), rows = cols == 0 ? 0 : x.size() / cols;
  ASSIGN_OR_RETURN(DeviceBuffer partials, ColumnSumScratch(rows, cols));
  return Launched("AccumulateColumnSums", kLaunch,
                  LaunchColumnSums(x.address(), nullptr, rows, out.address(), cols,
                                   partials.span<float>().address(), raw()));
}

absl::Status CudaStream::ActivationForward(Activation kind, DeviceSpan<const float> x,
                                           DeviceSpan<float> y) {
  RETURN_IF_ERROR(
      Check(x.size() == y.size(), "ActivationForward", "input and output sizes differ"));
  RETURN_IF_ERROR(failure());
  return Launched("ActivationForward", kLaunch,
                  LaunchActivationForward(kind, x.address(), y.address(), x.size(), raw()));
}

absl::Status CudaStream::ActivationBackward(Activation kind, DeviceSpan<const float> saved,
                                            DeviceSpan<const float> dy, DeviceSpan<float> dx) {
  RETURN_IF_ERROR(Check(saved.size() == dy.size() && dy.size() == dx.size(), "ActivationBackward",
                        "saved activation, output gradient and input gradient sizes differ"));
  RETURN_IF_ERROR(failure());
  return Launched("ActivationBackward", kLaunch,
                  LaunchActivationBackward(kind, saved.address(), dy.address(), dx.address(),
                                           dy.size(), raw()));
}

absl::Status CudaStream::Add(DeviceSpan<float> acc, DeviceSpan<const float> x) {
  RETURN_IF_ERROR(Check(acc.size() == x.size(), "Add", "operand sizes differ"));
  RETURN_IF_ERROR(failure());
  return Launched("Add", kLaunch, LaunchAdd(acc.address(), x.address(), x.size(), raw()));
}

absl::Status CudaStream::AddRowsModulo(DeviceSpan<float> x, DeviceSpan<const float> table,
                                       int64_t period) {
  RETURN_IF_ERROR(stream_checks::CheckModulo("AddRowsModulo", x.size(), table.size(), period));
  RETURN_IF_ERROR(failure());
  const size_t cols = table.size() / Count(period), rows = cols == 0 ? 0 : x.size() / cols;
  return Launched(
      "AddRowsModulo", kLaunch,
      LaunchAddRowsModulo(x.address(), rows, table.address(), Count(period), cols, raw()));
}

absl::Status CudaStream::SumRowsModulo(DeviceSpan<const float> x, int64_t period,
                                       DeviceSpan<float> out) {
  RETURN_IF_ERROR(stream_checks::CheckModulo("SumRowsModulo", x.size(), out.size(), period));
  RETURN_IF_ERROR(failure());
  const size_t cols = out.size() / Count(period), rows = cols == 0 ? 0 : x.size() / cols;
  return Launched(
      "SumRowsModulo", kLaunch,
      LaunchSumRowsModulo(x.address(), rows, Count(period), cols, out.address(), raw()));
}

absl::Status CudaStream::LayerNormForward(DeviceSpan<const float> x, int64_t dim,
                                          DeviceSpan<const float> weight,
                                          DeviceSpan<const float> bias, double eps,
                                          DeviceSpan<float> y, DeviceSpan<float> xhat,
                                          DeviceSpan<float> rstd) {
  RETURN_IF_ERROR(stream_checks::CheckLayerNorm(x.size(), dim, weight, bias, y, xhat, rstd));
  RETURN_IF_ERROR(failure());
  const size_t d = Count(dim), rows = x.size() / d;
  return Launched(
      "LayerNormForward", kLaunch,
      LaunchLayerNormForward(x.address(), rows, d, weight.empty() ? nullptr : weight.address(),
                             bias.empty() ? nullptr : bias.address(), eps, y.address(),
                             xhat.address(), rstd.address(), raw()));
}

absl::Status CudaStream::LayerNormBackward(DeviceSpan<const float> dy, DeviceSpan<const float> xhat,
                                           DeviceSpan<const float> rstd,
                                           DeviceSpan<const float> weight, DeviceSpan<float> dx,
                                           DeviceSpan<float> weight_grad,
                                           DeviceSpan<float> bias_grad) {
  RETURN_IF_ERROR(
      stream_checks::CheckLayerNormBackward(dy, xhat, rstd, weight, dx, weight_grad, bias_grad));
  RETURN_IF_ERROR(failure());
  const size_t rows = rstd.size(), d = rows == 0 ? 0 : dy.size() / rows;
  ASSIGN_OR_RETURN(DeviceBuffer partials, ColumnSumScratch(rows, d));
  return Launched("LayerNormBackward", kLaunch,
                  LaunchLayerNormBackward(dy.address(), xhat.address(), rstd.address(), rows, d,
                                          weight.empty() ? nullptr : weight.address(), dx.address(),
                                          weight_grad.empty() ? nullptr : weight_grad.address(),
                                          bias_grad.empty() ? nullptr : bias_grad.address(),
                                          partials.span<float>().address(), raw()));
}

absl::Status CudaStream::EmbeddingForward(DeviceSpan<const int32_t> ids,
                                          DeviceSpan<const float> table, int64_t dim,
                                          DeviceSpan<float> out) {
  RETURN_IF_ERROR(
      stream_checks::CheckEmbedding("EmbeddingForward", ids, table.size(), dim, out.size()));
  RETURN_IF_ERROR(failure());
  return Launched("EmbeddingForward", kLaunch,
                  LaunchEmbeddingForward(ids.address(), ids.size(), table.address(), Count(dim),
                                         out.address(), raw()));
}

absl::Status CudaStream::EmbeddingBackward(DeviceSpan<const int32_t> ids,
                                           DeviceSpan<const float> dout, int64_t dim,
                                           DeviceSpan<float> table_grad) {
  RETURN_IF_ERROR(
      stream_checks::CheckEmbedding("EmbeddingBackward", ids, table_grad.size(), dim, dout.size()));
  // The CUB sort and run-length encode count items in int.
  RETURN_IF_ERROR(Check(ids.size() <= static_cast<size_t>(INT_MAX), "EmbeddingBackward",
                        absl::StrCat(ids.size(), " ids are more than the CUDA device's 2^31 - 1")));
  RETURN_IF_ERROR(failure());
  if (ids.empty()) return absl::OkStatus();
  size_t scratch_bytes = 0;
  RETURN_IF_ERROR(Launched("EmbeddingBackward", "sizing the CUB scratch",
                           EmbeddingBackwardScratchBytes(ids.size(), &scratch_bytes)));
  ASSIGN_OR_RETURN(DeviceBuffer scratch, Scratch(scratch_bytes));
  return Launched("EmbeddingBackward", kLaunch,
                  LaunchEmbeddingBackward(ids.address(), ids.size(), dout.address(), Count(dim),
                                          table_grad.address(), scratch.byte_span().address(),
                                          scratch_bytes, raw()));
}

absl::Status CudaStream::SplitHeads(DeviceSpan<const float> rows, const HeadLayout& layout,
                                    DeviceSpan<float> heads) {
  RETURN_IF_ERROR(stream_checks::CheckHeads("SplitHeads", rows.size(), layout, heads.size()));
  RETURN_IF_ERROR(failure());
  return Launched("SplitHeads", kLaunch,
                  LaunchSplitHeads(rows.address(), layout, heads.address(), raw()));
}

absl::Status CudaStream::MergeHeads(DeviceSpan<const float> heads, const HeadLayout& layout,
                                    DeviceSpan<float> rows) {
  RETURN_IF_ERROR(stream_checks::CheckHeads("MergeHeads", rows.size(), layout, heads.size()));
  RETURN_IF_ERROR(failure());
  return Launched("MergeHeads", kLaunch,
                  LaunchMergeHeads(heads.address(), layout, rows.address(), raw()));
}

absl::Status CudaStream::CausalSoftmaxForward(DeviceSpan<const float> scores, int64_t seq,
                                              float scale, DeviceSpan<float> probs) {
  RETURN_IF_ERROR(
      stream_checks::CheckSquares("CausalSoftmaxForward", scores.size(), seq, probs.size()));
  RETURN_IF_ERROR(failure());
  const size_t t = Count(seq), matrices = t == 0 ? 0 : scores.size() / (t * t);
  return Launched(
      "CausalSoftmaxForward", kLaunch,
      LaunchCausalSoftmaxForward(scores.address(), matrices, t, scale, probs.address(), raw()));
}

absl::Status CudaStream::CausalSoftmaxBackward(DeviceSpan<const float> probs,
                                               DeviceSpan<const float> dprobs, int64_t seq,
                                               float scale, DeviceSpan<float> dscores) {
  RETURN_IF_ERROR(
      stream_checks::CheckSquares("CausalSoftmaxBackward", probs.size(), seq, dscores.size()));
  RETURN_IF_ERROR(Check(dprobs.size() == probs.size(), "CausalSoftmaxBackward",
                        "probabilities and their gradient sizes differ"));
  RETURN_IF_ERROR(failure());
  const size_t t = Count(seq), matrices = t == 0 ? 0 : probs.size() / (t * t);
  return Launched("CausalSoftmaxBackward", kLaunch,
                  LaunchCausalSoftmaxBackward(probs.address(), dprobs.address(), matrices, t, scale,
                                              dscores.address(), raw()));
}

}  // namespace flatshard::cuda
