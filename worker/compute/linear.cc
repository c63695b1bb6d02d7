#include "worker/compute/linear.h"

#include <utility>

#include "core/status_macros.h"

namespace flatshard::compute {

LinearLayer::LinearLayer(LayerInfo info, LayerParam weight, LayerParam bias, int64_t in_features,
                         int64_t out_features)
    : Layer(std::move(info)),
      weight_(std::move(weight)),
      bias_(std::move(bias)),
      in_(in_features),
      out_(out_features) {}

absl::Status LinearLayer::DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) {
  RETURN_IF_ERROR(CheckCols(in, in_, "input"));
  ASSIGN_OR_RETURN(const ParamSlot w, Resolve(ctx, weight_));
  const int64_t n = in.rows;
  x_ = SaveForBackward(in);
  ASSIGN_OR_RETURN(out, NewTensor(ctx.device, n, out_));
  if (n == 0) return absl::OkStatus();
  // y[N, out] = x[N, in] @ W^T[in, out]
  GemmArgs g;
  g.trans_b = true;
  g.m = n, g.n = out_, g.k = in_;
  g.a = in.span(), g.lda = in_;
  g.b = w.value, g.ldb = in_;
  g.c = out.span(), g.ldc = out_;
  RETURN_IF_ERROR(ctx.stream().Gemm(g));
  if (bias_.present()) {
    ASSIGN_OR_RETURN(const ParamSlot b, Resolve(ctx, bias_));
    RETURN_IF_ERROR(ctx.stream().AddBias(out.span(), b.value));  // y[r, :] += b
  }
  return absl::OkStatus();
}

absl::Status LinearLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  RETURN_IF_ERROR(CheckCols(dout, out_, "output gradient"));
  ASSIGN_OR_RETURN(const ParamSlot w, Resolve(ctx, weight_));
  const int64_t n = dout.rows;
  ASSIGN_OR_RETURN(din, NewTensor(ctx.device, n, in_));
  if (n > 0) {
    // dx[N, in] = dy[N, out] @ W[out, in]
    GemmArgs dx;
    dx.m = n, dx.n = in_, dx.k = out_;
    dx.a = dout.span(), dx.lda = out_;
    dx.b = w.value, dx.ldb = in_;
    dx.c = din.span(), dx.ldc = in_;
    RETURN_IF_ERROR(ctx.stream().Gemm(dx));
    if (!w.grad.empty()) {
      // dW[out, in] += dy^T[out, N] @ x[N, in]
      GemmArgs dw;
      dw.trans_a = true;
      dw.m = out_, dw.n = in_, dw.k = n;
      dw.beta = 1.0f;
      dw.a = dout.span(), dw.lda = out_;
      dw.b = x_.span(), dw.ldb = in_;
      dw.c = w.grad, dw.ldc = in_;
      RETURN_IF_ERROR(ctx.stream().Gemm(dw));
    }
    ASSIGN_OR_RETURN(const ParamSlot b, ResolveOptional(ctx, bias_));
    // db[out] += sum over rows of dy[N, out]
    if (!b.grad.empty()) RETURN_IF_ERROR(ctx.stream().AccumulateColumnSums(dout.span(), b.grad));
  }
  x_ = Tensor();  // activations live for one backward, as autograd frees its graph
  return absl::OkStatus();
}

}  // namespace flatshard::compute
