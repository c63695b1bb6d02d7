#include "worker/compute/layer_norm.h"

#include <utility>

#include "core/status_macros.h"

namespace flatshard::compute {

LayerNormLayer::LayerNormLayer(LayerInfo info, LayerParam weight, LayerParam bias, int64_t dim,
                               double eps)
    : Layer(std::move(info)),
      weight_(std::move(weight)),
      bias_(std::move(bias)),
      dim_(dim),
      eps_(eps) {}

absl::Status LayerNormLayer::DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) {
  const int64_t d = dim_ > 0 ? dim_ : in.cols;
  RETURN_IF_ERROR(CheckCols(in, d, "input"));
  ASSIGN_OR_RETURN(const ParamSlot w, ResolveOptional(ctx, weight_));
  ASSIGN_OR_RETURN(const ParamSlot b, ResolveOptional(ctx, bias_));
  const int64_t n = in.rows;
  ASSIGN_OR_RETURN(out, NewTensor(ctx.device, n, d));
  ASSIGN_OR_RETURN(xhat_, NewTensor(ctx.device, n, d));
  ASSIGN_OR_RETURN(rstd_, NewTensor(ctx.device, n, 1));
  if (n == 0) return absl::OkStatus();
  // y = (x - mean) * rstd * w + b, row statistics in double
  return ctx.stream().LayerNormForward(in.span(), d, w.value, b.value, eps_, out.span(),
                                       xhat_.span(), rstd_.span());
}

absl::Status LayerNormLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  const int64_t d = xhat_.cols;
  RETURN_IF_ERROR(CheckCols(dout, d, "output gradient"));
  if (dout.rows != xhat_.rows) {
    return absl::InvalidArgumentError(Where() + "output gradient does not match the forward rows");
  }
  ASSIGN_OR_RETURN(const ParamSlot w, ResolveOptional(ctx, weight_));
  ASSIGN_OR_RETURN(const ParamSlot b, ResolveOptional(ctx, bias_));
  ASSIGN_OR_RETURN(din, NewTensor(ctx.device, dout.rows, d));
  if (dout.rows > 0) {
    // dnorm = dy * w; dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat));
    // dw += sum_rows dy * xhat; db += sum_rows dy
    RETURN_IF_ERROR(ctx.stream().LayerNormBackward(dout.span(), xhat_.span(), rstd_.span(), w.value,
                                                   din.span(), w.grad, b.grad));
  }
  xhat_ = Tensor();
  rstd_ = Tensor();
  return absl::OkStatus();
}

}  // namespace flatshard::compute
