#include "worker/compute/activation.h"

#include "core/status_macros.h"
#include "worker/device/kernels/element_ops.h"

namespace flatshard::compute {

float GeluErf(float x) { return kernels::GeluErf(x); }
float GeluTanh(float x) { return kernels::GeluTanh(x); }

absl::Status ReluLayer::DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) {
  // y = max(x, 0), element-wise over [N, C]
  ASSIGN_OR_RETURN(out, NewTensor(ctx.device, in.rows, in.cols));
  RETURN_IF_ERROR(ctx.stream().ActivationForward(Activation::kRelu, in.span(), out.span()));
  ASSIGN_OR_RETURN(y_, CloneTensor(ctx.device, out));
  return absl::OkStatus();
}

absl::Status ReluLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  if (dout.size() != y_.size()) {
    return absl::InvalidArgumentError(Where() +
                                      "output gradient does not match the forward output");
  }
  // dx = dy where y > 0 (torch's convention: the gradient at 0 is 0)
  ASSIGN_OR_RETURN(din, NewTensor(ctx.device, dout.rows, dout.cols));
  RETURN_IF_ERROR(
      ctx.stream().ActivationBackward(Activation::kRelu, y_.span(), dout.span(), din.span()));
  y_ = Tensor();
  return absl::OkStatus();
}

absl::Status GeluLayer::DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) {
  x_ = SaveForBackward(in);
  ASSIGN_OR_RETURN(out, NewTensor(ctx.device, in.rows, in.cols));
  return ctx.stream().ActivationForward(activation(), in.span(), out.span());
}

absl::Status GeluLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  if (dout.size() != x_.size()) {
    return absl::InvalidArgumentError(Where() +
                                      "output gradient does not match the forward output");
  }
  // dx = dy * gelu'(x)
  ASSIGN_OR_RETURN(din, NewTensor(ctx.device, dout.rows, dout.cols));
  RETURN_IF_ERROR(
      ctx.stream().ActivationBackward(activation(), x_.span(), dout.span(), din.span()));
  x_ = Tensor();
  return absl::OkStatus();
}

absl::Status IdentityLayer::DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) {
  ASSIGN_OR_RETURN(out, CloneTensor(ctx.device, in));
  return absl::OkStatus();
}

absl::Status IdentityLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  ASSIGN_OR_RETURN(din, CloneTensor(ctx.device, dout));
  return absl::OkStatus();
}

}  // namespace flatshard::compute
