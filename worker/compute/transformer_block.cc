#include "worker/compute/transformer_block.h"

#include <utility>

#include "core/status_macros.h"
#include "worker/compute/containers.h"

namespace flatshard::compute {

TransformerBlockLayer::TransformerBlockLayer(LayerInfo info, std::unique_ptr<Layer> ln_1,
                                             std::unique_ptr<Layer> attn,
                                             std::unique_ptr<Layer> ln_2,
                                             std::unique_ptr<Layer> mlp)
    : Layer(std::move(info)),
      ln_1_(std::move(ln_1)),
      attn_(std::move(attn)),
      ln_2_(std::move(ln_2)),
      mlp_(std::move(mlp)) {}

absl::Status TransformerBlockLayer::DoForward(const Tensor& in, Tensor& out,
                                              const RunContext& ctx) {
  // x1 = x + attn(ln_1(x))
  Tensor normed;
  RETURN_IF_ERROR(ln_1_->Forward(in, normed, ctx));
  Tensor x1;
  RETURN_IF_ERROR(attn_->Forward(normed, x1, ctx));
  RETURN_IF_ERROR(AddInPlace(x1, in, Where(), ctx));
  // out = x1 + mlp(ln_2(x1))
  RETURN_IF_ERROR(ln_2_->Forward(x1, normed, ctx));
  RETURN_IF_ERROR(mlp_->Forward(normed, out, ctx));
  return AddInPlace(out, x1, Where(), ctx);
}

absl::Status TransformerBlockLayer::DoBackward(const Tensor& dout, Tensor& din,
                                               const RunContext& ctx) {
  // dx1 = dout + ln_2'(mlp'(dout))
  Tensor dnormed;
  RETURN_IF_ERROR(mlp_->Backward(dout, dnormed, ctx));
  Tensor dx1;
  RETURN_IF_ERROR(ln_2_->Backward(dnormed, dx1, ctx));
  RETURN_IF_ERROR(AddInPlace(dx1, dout, Where(), ctx));
  // dx = dx1 + ln_1'(attn'(dx1))
  RETURN_IF_ERROR(attn_->Backward(dx1, dnormed, ctx));
  RETURN_IF_ERROR(ln_1_->Backward(dnormed, din, ctx));
  return AddInPlace(din, dx1, Where(), ctx);
}

}  // namespace flatshard::compute
