#include "worker/device/stream_checks.h"

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard::stream_checks {

bool IsGradientDtype(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kBFloat16 || dtype == DType::kFloat16;
}

namespace {

// Elements a row-major [rows, cols] operand with row stride `ld` spans.
int64_t Extent(int64_t rows, int64_t cols, int64_t ld) {
  return rows == 0 || cols == 0 ? 0 : (rows - 1) * ld + cols;
}

absl::Status CheckOperand(const char* name, size_t have, int64_t rows, int64_t cols, int64_t ld,
                          int64_t batch, int64_t stride) {
  if (ld < cols) {
    return absl::InvalidArgumentError(absl::StrCat("Gemm: operand ", name, " has row stride ", ld,
                                                   " below its ", cols, " columns"));
  }
  const int64_t need = Extent(rows, cols, ld) + (batch - 1) * stride;
  if (static_cast<int64_t>(have) < need) {
    return absl::InvalidArgumentError(
        absl::StrCat("Gemm: operand ", name, " holds ", have, " floats, needs ", need));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Check(bool ok, absl::string_view op, absl::string_view problem) {
  if (ok) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": ", problem));
}

absl::Status CheckCast(DType src_dtype, DeviceSpan<const std::byte> src, DType dst_dtype,
                       DeviceSpan<std::byte> dst, size_t count) {
  RETURN_IF_ERROR(
      Check(IsFloating(src_dtype) && IsFloating(dst_dtype), "Cast",
            absl::StrCat("no cast from ", DTypeName(src_dtype), " to ", DTypeName(dst_dtype))));
  RETURN_IF_ERROR(Check(src.size() >= count * DTypeSize(src_dtype), "Cast",
                        absl::StrCat("the source holds ", src.size(), " bytes, not ", count, " ",
                                     DTypeName(src_dtype), " elements")));
  return Check(dst.size() >= count * DTypeSize(dst_dtype), "Cast",
               absl::StrCat("the target holds ", dst.size(), " bytes, not ", count, " ",
                            DTypeName(dst_dtype), " elements"));
}

absl::Status CheckPrepareGrad(DeviceSpan<const float> grad, DType reduce_dtype,
                              DeviceSpan<std::byte> out, size_t out_count) {
  RETURN_IF_ERROR(Check(IsGradientDtype(reduce_dtype), "PrepareGradForReduce",
                        absl::StrCat("reduce dtype ", DTypeName(reduce_dtype),
                                     " is not float32, bfloat16 or float16")));
  RETURN_IF_ERROR(Check(grad.size() <= out_count, "PrepareGradForReduce",
                        "the gradient is longer than the padded output"));
  return Check(out.size() >= out_count * DTypeSize(reduce_dtype), "PrepareGradForReduce",
               "the output is smaller than out_count elements");
}

absl::Status CheckAccumulateReduced(DType reduce_dtype, DeviceSpan<const std::byte> reduced,
                                    DeviceSpan<float> acc) {
  RETURN_IF_ERROR(Check(IsGradientDtype(reduce_dtype), "AccumulateReducedGrad",
                        absl::StrCat("reduce dtype ", DTypeName(reduce_dtype),
                                     " is not float32, bfloat16 or float16")));
  return Check(reduced.size() >= acc.size() * DTypeSize(reduce_dtype), "AccumulateReducedGrad",
               "the reduced shard is shorter than the gradient shard");
}

absl::Status CheckGemm(const GemmArgs& g) {
  RETURN_IF_ERROR(Check(g.m >= 0 && g.n >= 0 && g.k >= 0 && g.batch >= 1, "Gemm",
                        "m, n and k must be >= 0 and batch >= 1"));
  RETURN_IF_ERROR(CheckOperand("a", g.a.size(), g.trans_a ? g.k : g.m, g.trans_a ? g.m : g.k, g.lda,
                               g.batch, g.stride_a));
  RETURN_IF_ERROR(CheckOperand("b", g.b.size(), g.trans_b ? g.n : g.k, g.trans_b ? g.k : g.n, g.ldb,
                               g.batch, g.stride_b));
  return CheckOperand("c", g.c.size(), g.m, g.n, g.ldc, g.batch, g.stride_c);
}

absl::Status CheckRows(absl::string_view op, size_t total, size_t cols) {
  if (total == 0) return absl::OkStatus();
  return Check(cols > 0 && total % cols == 0, op,
               absl::StrCat(total, " elements are not whole rows of ", cols));
}

absl::Status CheckModulo(absl::string_view op, size_t total, size_t table_size, int64_t period) {
  RETURN_IF_ERROR(
      Check(period > 0 && table_size % static_cast<size_t>(period) == 0, op,
            absl::StrCat("the table of ", table_size, " elements is not ", period, " whole rows")));
  const size_t cols = table_size / static_cast<size_t>(period);
  RETURN_IF_ERROR(CheckRows(op, total, cols));
  return Check(cols > 0 || total == 0, op, "the table has no columns");
}

absl::Status CheckLayerNorm(size_t x_size, int64_t dim, DeviceSpan<const float> weight,
                            DeviceSpan<const float> bias, DeviceSpan<float> y,
                            DeviceSpan<float> xhat, DeviceSpan<float> rstd) {
  RETURN_IF_ERROR(Check(dim > 0, "LayerNormForward", "dim must be > 0"));
  const auto d = static_cast<size_t>(dim);
  RETURN_IF_ERROR(CheckRows("LayerNormForward", x_size, d));
  RETURN_IF_ERROR(
      Check((weight.empty() || weight.size() == d) && (bias.empty() || bias.size() == d),
            "LayerNormForward", "weight and bias must hold dim elements"));
  return Check(y.size() == x_size && xhat.size() == x_size && rstd.size() == x_size / d,
               "LayerNormForward", "y and xhat must match x, rstd hold one float per row");
}

absl::Status CheckLayerNormBackward(DeviceSpan<const float> dy, DeviceSpan<const float> xhat,
                                    DeviceSpan<const float> rstd, DeviceSpan<const float> weight,
                                    DeviceSpan<float> dx, DeviceSpan<float> weight_grad,
                                    DeviceSpan<float> bias_grad) {
  const size_t rows = rstd.size();
  RETURN_IF_ERROR(Check(rows > 0 && dy.size() % rows == 0, "LayerNormBackward",
                        "the gradient is not whole rows of the forward's"));
  const size_t d = dy.size() / rows;
  RETURN_IF_ERROR(Check(xhat.size() == dy.size() && dx.size() == dy.size(), "LayerNormBackward",
                        "xhat and dx must match the output gradient"));
  return Check((weight.empty() || weight.size() == d) &&
                   (weight_grad.empty() || weight_grad.size() == d) &&
                   (bias_grad.empty() || bias_grad.size() == d),
               "LayerNormBackward", "weight and its grads must hold dim elements");
}

absl::Status CheckEmbedding(absl::string_view op, DeviceSpan<const int32_t> ids, size_t table_size,
                            int64_t dim, size_t rows_size) {
  RETURN_IF_ERROR(Check(dim > 0 && table_size % static_cast<size_t>(dim) == 0, op,
                        "the table is not whole rows of dim"));
  return Check(rows_size == ids.size() * static_cast<size_t>(dim), op,
               absl::StrCat("the activation holds ", rows_size, " floats for ", ids.size(),
                            " ids of dim ", dim));
}

absl::Status CheckHeads(absl::string_view op, size_t rows_size, const HeadLayout& l,
                        size_t heads_size) {
  RETURN_IF_ERROR(Check(l.batch >= 0 && l.seq >= 0 && l.heads > 0 && l.head_dim > 0, op,
                        "batch, seq must be >= 0, heads and head_dim > 0"));
  RETURN_IF_ERROR(Check(l.col_offset >= 0 && l.col_offset + l.heads * l.head_dim <= l.row_stride,
                        op, "the heads' columns lie outside the rows"));
  RETURN_IF_ERROR(Check(rows_size == static_cast<size_t>(l.batch * l.seq * l.row_stride), op,
                        "the row-major activation is not [batch * seq, row_stride]"));
  return Check(heads_size == static_cast<size_t>(l.elements()), op,
               "the heads tensor is not [batch, heads, seq, head_dim]");
}

absl::Status CheckSquares(absl::string_view op, size_t size, int64_t seq, size_t other_size) {
  RETURN_IF_ERROR(Check(seq > 0, op, "seq must be > 0"));
  const auto square = static_cast<size_t>(seq * seq);
  return Check(size % square == 0 && other_size == size, op,
               absl::StrCat("operands are not whole [", seq, ", ", seq, "] matrices"));
}

absl::Status CheckMse(DeviceSpan<const float> out, DeviceSpan<const float> target,
                      DeviceSpan<float> grad, DeviceSpan<double> loss) {
  RETURN_IF_ERROR(Check(!out.empty(), "MseLoss", "the model output is empty"));
  RETURN_IF_ERROR(Check(target.size() == out.size() && grad.size() == out.size(), "MseLoss",
                        "output, target and gradient sizes differ"));
  return Check(loss.size() == 1, "MseLoss", "the loss holds one double");
}

absl::Status CheckCrossEntropy(DeviceSpan<const float> logits, int64_t classes,
                               DeviceSpan<const int32_t> labels, DeviceSpan<float> grad,
                               DeviceSpan<double> loss) {
  RETURN_IF_ERROR(
      Check(classes > 0 && !labels.empty(), "CrossEntropyLoss", "the logits are empty"));
  RETURN_IF_ERROR(Check(logits.size() == labels.size() * static_cast<size_t>(classes),
                        "CrossEntropyLoss",
                        absl::StrCat(labels.size(), " labels for ", logits.size(), " logits of ",
                                     classes, " classes")));
  RETURN_IF_ERROR(Check(grad.size() == logits.size(), "CrossEntropyLoss",
                        "the gradient does not match the logits"));
  return Check(loss.size() == 1, "CrossEntropyLoss", "the loss holds one double");
}

}  // namespace flatshard::stream_checks
