#include "worker/compute/containers.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard::compute {

absl::Status ChainForward(const std::vector<std::unique_ptr<Layer>>& layers, const Tensor& in,
                          Tensor& out, const RunContext& ctx) {
  if (layers.empty()) {
    ASSIGN_OR_RETURN(out, CloneTensor(ctx.device, in));
    return absl::OkStatus();
  }
  Tensor current;
  for (size_t i = 0; i < layers.size(); ++i) {
    Tensor next;
    RETURN_IF_ERROR(layers[i]->Forward(i == 0 ? in : current, next, ctx));
    current = std::move(next);
  }
  out = std::move(current);
  return absl::OkStatus();
}

absl::Status ChainBackward(const std::vector<std::unique_ptr<Layer>>& layers, const Tensor& dout,
                           Tensor& din, const RunContext& ctx) {
  if (layers.empty()) {
    ASSIGN_OR_RETURN(din, CloneTensor(ctx.device, dout));
    return absl::OkStatus();
  }
  Tensor current;
  for (size_t i = layers.size(); i-- > 0;) {
    Tensor prev;
    RETURN_IF_ERROR(layers[i]->Backward(i + 1 == layers.size() ? dout : current, prev, ctx));
    current = std::move(prev);
  }
  din = std::move(current);
  return absl::OkStatus();
}

absl::Status AddInPlace(Tensor& a, const Tensor& b, const std::string& where,
                        const RunContext& ctx) {
  if (a.rows != b.rows || a.cols != b.cols) {
    return absl::InvalidArgumentError(absl::StrCat(where, "cannot add [", b.rows, ", ", b.cols,
                                                   "] to [", a.rows, ", ", a.cols, "]"));
  }
  return ctx.stream().Add(a.span(), b.span());
}

SequentialLayer::SequentialLayer(LayerInfo info, std::vector<std::unique_ptr<Layer>> children)
    : Layer(std::move(info)), children_(std::move(children)) {}

absl::Status SequentialLayer::DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) {
  return ChainForward(children_, in, out, ctx);
}

absl::Status SequentialLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  return ChainBackward(children_, dout, din, ctx);
}

ResidualLayer::ResidualLayer(LayerInfo info, std::vector<std::unique_ptr<Layer>> children)
    : Layer(std::move(info)), children_(std::move(children)) {}

absl::Status ResidualLayer::DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) {
  // y = x + f(x)
  RETURN_IF_ERROR(ChainForward(children_, in, out, ctx));
  return AddInPlace(out, in, Where(), ctx);
}

absl::Status ResidualLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  // dx = dy + f'(x)^T dy
  RETURN_IF_ERROR(ChainBackward(children_, dout, din, ctx));
  return AddInPlace(din, dout, Where(), ctx);
}

}  // namespace flatshard::compute
