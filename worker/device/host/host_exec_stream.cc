#include "worker/device/host/host_exec_stream.h"

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"

#include "core/clip_grad_norm_math.h"
#include "core/status_macros.h"
#include "worker/device/host/host_kernels.h"
#include "worker/device/host/host_optimizer_kernels.h"
#include "worker/device/host/host_softmax_kernels.h"
#include "worker/device/stream_checks.h"

namespace flatshard {
namespace {

using stream_checks::Check;
using Resolved = ResolvedAccesses;

size_t Count(int64_t n) { return static_cast<size_t>(n); }

}  // namespace

absl::Status HostExecStream::CopyToDevice(DeviceSpan<std::byte> dst,
                                          std::span<const std::byte> src) {
  RETURN_IF_ERROR(
      Check(dst.size() == src.size(), "CopyToDevice", "source and target sizes differ"));
  const size_t n = src.size();
  return Submit("CopyToDevice", {WriteOf(dst), {src.data(), n, false, true}},
                [n](const Resolved& r) {
                  if (n > 0) std::memcpy(r.get<void>(0), r.get<const void>(1), n);
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::CopyToHost(std::span<std::byte> dst, DeviceSpan<const std::byte> src) {
  RETURN_IF_ERROR(Check(dst.size() == src.size(), "CopyToHost", "source and target sizes differ"));
  const size_t n = src.size();
  return Submit("CopyToHost", {{dst.data(), n, true, true}, ReadOf(src)}, [n](const Resolved& r) {
    if (n > 0) std::memcpy(r.get<void>(0), r.get<const void>(1), n);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::Copy(DeviceSpan<std::byte> dst, DeviceSpan<const std::byte> src) {
  RETURN_IF_ERROR(Check(dst.size() == src.size(), "Copy", "source and target sizes differ"));
  const size_t n = src.size();
  return Submit("Copy", {WriteOf(dst), ReadOf(src)}, [n](const Resolved& r) {
    if (n > 0) std::memmove(r.get<void>(0), r.get<const void>(1), n);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::Zero(DeviceSpan<std::byte> dst) {
  const size_t n = dst.size();
  return Submit("Zero", {WriteOf(dst)}, [n](const Resolved& r) {
    if (n > 0) std::memset(r.get<void>(0), 0, n);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::Cast(DType src_dtype, DeviceSpan<const std::byte> src, DType dst_dtype,
                                  DeviceSpan<std::byte> dst, size_t count) {
  RETURN_IF_ERROR(stream_checks::CheckCast(src_dtype, src, dst_dtype, dst, count));
  return Submit("Cast", {ReadOf(src), WriteOf(dst)}, [=](const Resolved& r) {
    host_kernels::Cast(src_dtype, r.get<const std::byte>(0), dst_dtype, r.get<std::byte>(1), count);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::PrepareGradForReduce(DeviceSpan<const float> grad, DType reduce_dtype,
                                                  DeviceSpan<std::byte> out, size_t out_count,
                                                  double pre_divide) {
  RETURN_IF_ERROR(stream_checks::CheckPrepareGrad(grad, reduce_dtype, out, out_count));
  const size_t n = grad.size();
  return Submit("PrepareGradForReduce", {ReadOf(grad), WriteOf(out)}, [=](const Resolved& r) {
    host_kernels::PrepareGradForReduce(r.get<const float>(0), n, reduce_dtype, r.get<std::byte>(1),
                                       out_count, pre_divide);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::AccumulateReducedGrad(DType reduce_dtype,
                                                   DeviceSpan<const std::byte> reduced,
                                                   DeviceSpan<float> acc, double post_divide) {
  RETURN_IF_ERROR(stream_checks::CheckAccumulateReduced(reduce_dtype, reduced, acc));
  const size_t n = acc.size();
  return Submit("AccumulateReducedGrad", {ReadOf(reduced), WriteOf(acc)}, [=](const Resolved& r) {
    host_kernels::AccumulateReducedGrad(reduce_dtype, r.get<const std::byte>(0), r.get<float>(1), n,
                                        post_divide);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::Gemm(const GemmArgs& args) {
  RETURN_IF_ERROR(stream_checks::CheckGemm(args));
  return Submit(
      "Gemm", {ReadOf(args.a), ReadOf(args.b), WriteOf(args.c)}, [args](const Resolved& r) {
        host_kernels::Gemm({&args, r.get<const float>(0), r.get<const float>(1), r.get<float>(2)});
        return absl::OkStatus();
      });
}

absl::Status HostExecStream::AddBias(DeviceSpan<float> y, DeviceSpan<const float> bias) {
  RETURN_IF_ERROR(stream_checks::CheckRows("AddBias", y.size(), bias.size()));
  const size_t cols = bias.size(), rows = cols == 0 ? 0 : y.size() / cols;
  return Submit("AddBias", {WriteOf(y), ReadOf(bias)}, [=](const Resolved& r) {
    host_kernels::AddBias(r.get<float>(0), rows, r.get<const float>(1), cols);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::AccumulateColumnSums(DeviceSpan<const float> x,
                                                  DeviceSpan<float> out) {
  RETURN_IF_ERROR(stream_checks::CheckRows("AccumulateColumnSums", x.size(), out.size()));
  const size_t cols = out.size(), rows = cols == 0 ? 0 : x.size() / cols;
  return Submit("AccumulateColumnSums", {ReadOf(x), WriteOf(out)}, [=](const Resolved& r) {
    host_kernels::AccumulateColumnSums(r.get<const float>(0), rows, r.get<float>(1), cols);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::ActivationForward(Activation kind, DeviceSpan<const float> x,
                                               DeviceSpan<float> y) {
  RETURN_IF_ERROR(
      Check(x.size() == y.size(), "ActivationForward", "input and output sizes differ"));
  const size_t n = x.size();
  return Submit("ActivationForward", {ReadOf(x), WriteOf(y)}, [=](const Resolved& r) {
    host_kernels::ActivationForward(kind, r.get<const float>(0), r.get<float>(1), n);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::ActivationBackward(Activation kind, DeviceSpan<const float> saved,
                                                DeviceSpan<const float> dy, DeviceSpan<float> dx) {
  RETURN_IF_ERROR(Check(saved.size() == dy.size() && dy.size() == dx.size(), "ActivationBackward",
                        "saved activation, output gradient and input gradient sizes differ"));
  const size_t n = dy.size();
  return Submit("ActivationBackward", {ReadOf(saved), ReadOf(dy), WriteOf(dx)},
                [=](const Resolved& r) {
                  host_kernels::ActivationBackward(kind, r.get<const float>(0),
                                                   r.get<const float>(1), r.get<float>(2), n);
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::Add(DeviceSpan<float> acc, DeviceSpan<const float> x) {
  RETURN_IF_ERROR(Check(acc.size() == x.size(), "Add", "operand sizes differ"));
  const size_t n = x.size();
  return Submit("Add", {WriteOf(acc), ReadOf(x)}, [=](const Resolved& r) {
    host_kernels::Add(r.get<float>(0), r.get<const float>(1), n);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::AddRowsModulo(DeviceSpan<float> x, DeviceSpan<const float> table,
                                           int64_t period) {
  RETURN_IF_ERROR(stream_checks::CheckModulo("AddRowsModulo", x.size(), table.size(), period));
  const size_t cols = table.size() / Count(period), rows = x.size() / cols;
  return Submit("AddRowsModulo", {WriteOf(x), ReadOf(table)}, [=](const Resolved& r) {
    host_kernels::AddRowsModulo(r.get<float>(0), rows, r.get<const float>(1), Count(period), cols);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::SumRowsModulo(DeviceSpan<const float> x, int64_t period,
                                           DeviceSpan<float> out) {
  RETURN_IF_ERROR(stream_checks::CheckModulo("SumRowsModulo", x.size(), out.size(), period));
  const size_t cols = out.size() / Count(period), rows = x.size() / cols;
  return Submit("SumRowsModulo", {ReadOf(x), WriteOf(out)}, [=](const Resolved& r) {
    host_kernels::SumRowsModulo(r.get<const float>(0), rows, Count(period), cols, r.get<float>(1));
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::LayerNormForward(DeviceSpan<const float> x, int64_t dim,
                                              DeviceSpan<const float> weight,
                                              DeviceSpan<const float> bias, double eps,
                                              DeviceSpan<float> y, DeviceSpan<float> xhat,
                                              DeviceSpan<float> rstd) {
  RETURN_IF_ERROR(stream_checks::CheckLayerNorm(x.size(), dim, weight, bias, y, xhat, rstd));
  const size_t d = Count(dim), rows = x.size() / d;
  const bool has_w = !weight.empty(), has_b = !bias.empty();
  return Submit("LayerNormForward",
                {ReadOf(x), ReadOf(weight), ReadOf(bias), WriteOf(y), WriteOf(xhat), WriteOf(rstd)},
                [=](const Resolved& r) {
                  host_kernels::LayerNormForward(r.get<const float>(0), rows, d,
                                                 has_w ? r.get<const float>(1) : nullptr,
                                                 has_b ? r.get<const float>(2) : nullptr, eps,
                                                 r.get<float>(3), r.get<float>(4), r.get<float>(5));
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::LayerNormBackward(DeviceSpan<const float> dy,
                                               DeviceSpan<const float> xhat,
                                               DeviceSpan<const float> rstd,
                                               DeviceSpan<const float> weight, DeviceSpan<float> dx,
                                               DeviceSpan<float> weight_grad,
                                               DeviceSpan<float> bias_grad) {
  RETURN_IF_ERROR(
      stream_checks::CheckLayerNormBackward(dy, xhat, rstd, weight, dx, weight_grad, bias_grad));
  const size_t rows = rstd.size(), d = rows == 0 ? 0 : dy.size() / rows;
  const bool has_w = !weight.empty(), has_wg = !weight_grad.empty(), has_bg = !bias_grad.empty();
  return Submit("LayerNormBackward",
                {ReadOf(dy), ReadOf(xhat), ReadOf(rstd), ReadOf(weight), WriteOf(dx),
                 WriteOf(weight_grad), WriteOf(bias_grad)},
                [=](const Resolved& r) {
                  host_kernels::LayerNormBackward(
                      r.get<const float>(0), r.get<const float>(1), r.get<const float>(2), rows, d,
                      has_w ? r.get<const float>(3) : nullptr, r.get<float>(4),
                      has_wg ? r.get<float>(5) : nullptr, has_bg ? r.get<float>(6) : nullptr);
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::EmbeddingForward(DeviceSpan<const int32_t> ids,
                                              DeviceSpan<const float> table, int64_t dim,
                                              DeviceSpan<float> out) {
  RETURN_IF_ERROR(
      stream_checks::CheckEmbedding("EmbeddingForward", ids, table.size(), dim, out.size()));
  const size_t n = ids.size(), d = Count(dim);
  return Submit("EmbeddingForward", {ReadOf(ids), ReadOf(table), WriteOf(out)},
                [=](const Resolved& r) {
                  host_kernels::EmbeddingForward(r.get<const int32_t>(0), n, r.get<const float>(1),
                                                 d, r.get<float>(2));
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::EmbeddingBackward(DeviceSpan<const int32_t> ids,
                                               DeviceSpan<const float> dout, int64_t dim,
                                               DeviceSpan<float> table_grad) {
  RETURN_IF_ERROR(
      stream_checks::CheckEmbedding("EmbeddingBackward", ids, table_grad.size(), dim, dout.size()));
  const size_t n = ids.size(), d = Count(dim);
  return Submit("EmbeddingBackward", {ReadOf(ids), ReadOf(dout), WriteOf(table_grad)},
                [=](const Resolved& r) {
                  host_kernels::EmbeddingBackward(r.get<const int32_t>(0), n, r.get<const float>(1),
                                                  d, r.get<float>(2));
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::SplitHeads(DeviceSpan<const float> rows, const HeadLayout& layout,
                                        DeviceSpan<float> heads) {
  RETURN_IF_ERROR(stream_checks::CheckHeads("SplitHeads", rows.size(), layout, heads.size()));
  return Submit("SplitHeads", {ReadOf(rows), WriteOf(heads)}, [=](const Resolved& r) {
    host_kernels::SplitHeads(r.get<const float>(0), layout, r.get<float>(1));
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::MergeHeads(DeviceSpan<const float> heads, const HeadLayout& layout,
                                        DeviceSpan<float> rows) {
  RETURN_IF_ERROR(stream_checks::CheckHeads("MergeHeads", rows.size(), layout, heads.size()));
  return Submit("MergeHeads", {ReadOf(heads), WriteOf(rows)}, [=](const Resolved& r) {
    host_kernels::MergeHeads(r.get<const float>(0), layout, r.get<float>(1));
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::CausalSoftmaxForward(DeviceSpan<const float> scores, int64_t seq,
                                                  float scale, DeviceSpan<float> probs) {
  RETURN_IF_ERROR(
      stream_checks::CheckSquares("CausalSoftmaxForward", scores.size(), seq, probs.size()));
  const size_t t = Count(seq), matrices = t == 0 ? 0 : scores.size() / (t * t);
  return Submit("CausalSoftmaxForward", {ReadOf(scores), WriteOf(probs)}, [=](const Resolved& r) {
    host_kernels::CausalSoftmaxForward(r.get<const float>(0), matrices, t, scale, r.get<float>(1));
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::CausalSoftmaxBackward(DeviceSpan<const float> probs,
                                                   DeviceSpan<const float> dprobs, int64_t seq,
                                                   float scale, DeviceSpan<float> dscores) {
  RETURN_IF_ERROR(
      stream_checks::CheckSquares("CausalSoftmaxBackward", probs.size(), seq, dscores.size()));
  RETURN_IF_ERROR(Check(dprobs.size() == probs.size(), "CausalSoftmaxBackward",
                        "probabilities and their gradient sizes differ"));
  const size_t t = Count(seq), matrices = t == 0 ? 0 : probs.size() / (t * t);
  return Submit("CausalSoftmaxBackward", {ReadOf(probs), ReadOf(dprobs), WriteOf(dscores)},
                [=](const Resolved& r) {
                  host_kernels::CausalSoftmaxBackward(r.get<const float>(0), r.get<const float>(1),
                                                      matrices, t, scale, r.get<float>(2));
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::MseLoss(DeviceSpan<const float> out, DeviceSpan<const float> target,
                                     DeviceSpan<float> grad, DeviceSpan<double> loss) {
  RETURN_IF_ERROR(stream_checks::CheckMse(out, target, grad, loss));
  const size_t n = out.size();
  return Submit("MseLoss", {ReadOf(out), ReadOf(target), WriteOf(grad), WriteOf(loss)},
                [=](const Resolved& r) {
                  host_kernels::MseLoss(r.get<const float>(0), r.get<const float>(1), n,
                                        r.get<float>(2), r.get<double>(3));
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::CrossEntropyLoss(DeviceSpan<const float> logits, int64_t classes,
                                              DeviceSpan<const int32_t> labels,
                                              DeviceSpan<float> grad, DeviceSpan<double> loss) {
  RETURN_IF_ERROR(stream_checks::CheckCrossEntropy(logits, classes, labels, grad, loss));
  const size_t v = Count(classes), rows = labels.size();
  return Submit("CrossEntropyLoss", {ReadOf(logits), ReadOf(labels), WriteOf(grad), WriteOf(loss)},
                [=](const Resolved& r) {
                  host_kernels::CrossEntropyLoss(r.get<const float>(0), rows, v,
                                                 r.get<const int32_t>(1), r.get<float>(2),
                                                 r.get<double>(3));
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::SgdStep(const SgdCoefficients& c, DeviceSpan<float> params,
                                     DeviceSpan<const float> grads, DeviceSpan<float> momentum) {
  RETURN_IF_ERROR(Check(grads.size() == params.size() &&
                            (c.momentum ? momentum.size() == params.size() : momentum.empty()),
                        "SgdStep", "params, grads and momentum buffer sizes differ"));
  const size_t n = params.size();
  return Submit("SgdStep", {WriteOf(params), ReadOf(grads), WriteOf(momentum)},
                [=](const Resolved& r) {
                  host_kernels::SgdStep(c, r.get<float>(0), r.get<const float>(1),
                                        c.momentum ? r.get<float>(2) : nullptr, n);
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::AdamStep(const AdamCoefficients& c, DeviceSpan<float> params,
                                      DeviceSpan<const float> grads, DeviceSpan<float> exp_avg,
                                      DeviceSpan<float> exp_avg_sq,
                                      DeviceSpan<float> max_exp_avg_sq) {
  const size_t n = params.size();
  RETURN_IF_ERROR(Check(grads.size() == n && exp_avg.size() == n && exp_avg_sq.size() == n &&
                            (c.amsgrad ? max_exp_avg_sq.size() == n : max_exp_avg_sq.empty()),
                        "AdamStep", "params, grads and optimizer state sizes differ"));
  return Submit("AdamStep",
                {WriteOf(params), ReadOf(grads), WriteOf(exp_avg), WriteOf(exp_avg_sq),
                 WriteOf(max_exp_avg_sq)},
                [=](const Resolved& r) {
                  host_kernels::AdamStep(c, r.get<float>(0), r.get<const float>(1), r.get<float>(2),
                                         r.get<float>(3), c.amsgrad ? r.get<float>(4) : nullptr, n);
                  return absl::OkStatus();
                });
}

absl::Status HostExecStream::GradNormContribution(std::span<const DeviceSpan<const float>> grads,
                                                  double norm_type, DeviceSpan<double> out) {
  RETURN_IF_ERROR(Check(out.size() == 1, "GradNormContribution", "the output holds one double"));
  std::vector<MemoryAccess> accesses{WriteOf(out)};
  std::vector<size_t> sizes;
  for (const DeviceSpan<const float>& g : grads) {
    accesses.push_back(ReadOf(g));
    sizes.push_back(g.size());
  }
  return Submit("GradNormContribution", std::move(accesses), [=](const Resolved& r) {
    double local = 0.0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      const float* g = r.get<const float>(i + 1);
      if (clip_math::IsInf(norm_type)) {
        local = clip_math::NaNMax(local, host_kernels::GradAbsMax(g, sizes[i]));
      } else {
        local += clip_math::TensorContribution(host_kernels::GradAbsPowSum(g, sizes[i], norm_type),
                                               norm_type);
      }
    }
    *r.get<double>(0) = clip_math::IsInf(norm_type) ? local : clip_math::RoundToFloat(local);
    return absl::OkStatus();
  });
}

absl::Status HostExecStream::ClipGrads(std::span<const DeviceSpan<float>> grads,
                                       DeviceSpan<const double> reduced, double norm_type,
                                       double max_norm) {
  RETURN_IF_ERROR(Check(reduced.size() == 1, "ClipGrads", "the reduced norm is one double"));
  std::vector<MemoryAccess> accesses{ReadOf(reduced)};
  std::vector<size_t> sizes;
  for (const DeviceSpan<float>& g : grads) {
    accesses.push_back(WriteOf(g));
    sizes.push_back(g.size());
  }
  return Submit("ClipGrads", std::move(accesses), [=](const Resolved& r) {
    const double total = clip_math::TotalNorm(*r.get<const double>(0), 0.0, norm_type);
    const float coef = clip_math::ClipCoefficient(max_norm, total);
    for (size_t i = 0; i < sizes.size(); ++i) {
      host_kernels::ScaleGrads(r.get<float>(i + 1), sizes[i], coef);
    }
    return absl::OkStatus();
  });
}

}  // namespace flatshard
