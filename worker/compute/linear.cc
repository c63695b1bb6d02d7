#include "worker/compute/linear.h"

#include <utility>

#include <cblas.h>

#include "core/status_macros.h"

namespace flatshard::compute {
namespace {

// BLAS takes int dimensions; layer sizes are far below 2^31 (Create checks
// the parameter shapes, the batch rows are checked by the model).
blasint B(int64_t n) { return static_cast<blasint>(n); }

}  // namespace

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
  x_ = in;
  ResizeZero(out, n, out_);
  if (n == 0) return absl::OkStatus();
  // y[N, out] = x[N, in] @ W^T[in, out]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, B(n), B(out_), B(in_), 1.0f,
              in.values.data(), B(in_), w.value, B(in_), 0.0f, out.values.data(), B(out_));
  if (bias_.present()) {
    ASSIGN_OR_RETURN(const ParamSlot b, Resolve(ctx, bias_));
    // y[r, :] += b[:]
    for (int64_t r = 0; r < n; ++r) {
      float* y = out.Row(r);
      for (int64_t o = 0; o < out_; ++o) y[o] += b.value[o];
    }
  }
  return absl::OkStatus();
}

absl::Status LinearLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  RETURN_IF_ERROR(CheckCols(dout, out_, "output gradient"));
  ASSIGN_OR_RETURN(const ParamSlot w, Resolve(ctx, weight_));
  const int64_t n = dout.rows;
  ResizeZero(din, n, in_);
  if (n == 0) return absl::OkStatus();
  // dx[N, in] = dy[N, out] @ W[out, in]
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, B(n), B(in_), B(out_), 1.0f,
              dout.values.data(), B(out_), w.value, B(in_), 0.0f, din.values.data(), B(in_));
  if (w.grad != nullptr) {
    // dW[out, in] += dy^T[out, N] @ x[N, in]
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, B(out_), B(in_), B(n), 1.0f,
                dout.values.data(), B(out_), x_.values.data(), B(in_), 1.0f, w.grad, B(in_));
  }
  if (bias_.present()) {
    ASSIGN_OR_RETURN(const ParamSlot b, Resolve(ctx, bias_));
    if (b.grad != nullptr) {
      // db[out] += sum over rows of dy[N, out]
      for (int64_t r = 0; r < n; ++r) {
        const float* dy = dout.Row(r);
        for (int64_t o = 0; o < out_; ++o) b.grad[o] += dy[o];
      }
    }
  }
  x_ = Tensor();  // activations live for one backward, as autograd frees its graph
  return absl::OkStatus();
}

}  // namespace flatshard::compute
