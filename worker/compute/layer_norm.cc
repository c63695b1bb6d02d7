#include "worker/compute/layer_norm.h"

#include <cmath>
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
  const float* w = nullptr;
  const float* b = nullptr;
  if (weight_.present()) {
    ASSIGN_OR_RETURN(const ParamSlot slot, Resolve(ctx, weight_));
    w = slot.value;
  }
  if (bias_.present()) {
    ASSIGN_OR_RETURN(const ParamSlot slot, Resolve(ctx, bias_));
    b = slot.value;
  }
  const int64_t n = in.rows;
  ResizeZero(out, n, d);
  ResizeZero(xhat_, n, d);
  rstd_.assign(static_cast<size_t>(n), 0.0f);
  for (int64_t r = 0; r < n; ++r) {
    const float* x = in.Row(r);
    // Row statistics in double: cheap, and var = E[(x - mean)^2] stays accurate.
    double mean = 0.0;
    for (int64_t i = 0; i < d; ++i) mean += x[i];
    mean /= static_cast<double>(d);
    double var = 0.0;
    for (int64_t i = 0; i < d; ++i) var += (x[i] - mean) * (x[i] - mean);
    var /= static_cast<double>(d);  // biased, as torch
    const auto rstd = static_cast<float>(1.0 / std::sqrt(var + eps_));
    rstd_[static_cast<size_t>(r)] = rstd;
    float* xhat = xhat_.Row(r);
    float* y = out.Row(r);
    for (int64_t i = 0; i < d; ++i) {
      xhat[i] = static_cast<float>(x[i] - mean) * rstd;
      y[i] = xhat[i] * (w != nullptr ? w[i] : 1.0f) + (b != nullptr ? b[i] : 0.0f);
    }
  }
  return absl::OkStatus();
}

absl::Status LayerNormLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  const int64_t d = xhat_.cols;
  RETURN_IF_ERROR(CheckCols(dout, d, "output gradient"));
  if (dout.rows != xhat_.rows) {
    return absl::InvalidArgumentError(Where() + "output gradient does not match the forward rows");
  }
  ParamSlot w;
  ParamSlot b;
  if (weight_.present()) {
    ASSIGN_OR_RETURN(w, Resolve(ctx, weight_));
  }
  if (bias_.present()) {
    ASSIGN_OR_RETURN(b, Resolve(ctx, bias_));
  }
  const int64_t n = dout.rows;
  ResizeZero(din, n, d);
  for (int64_t r = 0; r < n; ++r) {
    const float* dy = dout.Row(r);
    const float* xhat = xhat_.Row(r);
    // dnorm = dy * w; dx = rstd * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
    double mean_dnorm = 0.0;
    double mean_dnorm_xhat = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      const float dnorm = dy[i] * (w.value != nullptr ? w.value[i] : 1.0f);
      mean_dnorm += dnorm;
      mean_dnorm_xhat += dnorm * xhat[i];
    }
    mean_dnorm /= static_cast<double>(d);
    mean_dnorm_xhat /= static_cast<double>(d);
    const float rstd = rstd_[static_cast<size_t>(r)];
    float* dx = din.Row(r);
    for (int64_t i = 0; i < d; ++i) {
      const float dnorm = dy[i] * (w.value != nullptr ? w.value[i] : 1.0f);
      dx[i] = rstd * static_cast<float>(dnorm - mean_dnorm - xhat[i] * mean_dnorm_xhat);
      // dw += dy * xhat; db += dy
      if (w.grad != nullptr) w.grad[i] += dy[i] * xhat[i];
      if (b.grad != nullptr) b.grad[i] += dy[i];
    }
  }
  xhat_ = Tensor();
  rstd_.clear();
  return absl::OkStatus();
}

}  // namespace flatshard::compute
