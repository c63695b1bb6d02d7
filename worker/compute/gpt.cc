#include "worker/compute/gpt.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard::compute {

GptLayer::GptLayer(LayerInfo info, std::unique_ptr<EmbeddingLayer> wte,
                   std::unique_ptr<EmbeddingLayer> wpe, std::unique_ptr<Layer> h,
                   std::unique_ptr<Layer> ln_f, std::unique_ptr<Layer> lm_head)
    : Layer(std::move(info)),
      wte_(std::move(wte)),
      wpe_(std::move(wpe)),
      h_(std::move(h)),
      ln_f_(std::move(ln_f)),
      lm_head_(std::move(lm_head)) {}

absl::Status GptLayer::DoForward(const Tensor&, Tensor& out, const RunContext& ctx) {
  if (ctx.ids == nullptr) {
    return absl::InvalidArgumentError(Where() + "needs token ids as input, but the batch has none");
  }
  const int64_t t = ctx.seq_len;
  const auto n = static_cast<int64_t>(ctx.ids->host.size());
  if (t <= 0 || n % t != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(Where(), n, " token ids are not a whole number of sequences of ", t));
  }
  if (t > wpe_->num_embeddings()) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), "sequence length ", t, " exceeds the ",
                                                   wpe_->num_embeddings(), " positions of wpe"));
  }
  seq_ = t;
  // tok [B*T, C] = wte(ids)
  Tensor x;
  RETURN_IF_ERROR(wte_->Forward(Tensor(), x, ctx));
  // pos [T, C] = wpe(0..T-1)
  positions_.resize(static_cast<size_t>(t));
  for (int64_t i = 0; i < t; ++i) positions_[static_cast<size_t>(i)] = static_cast<int32_t>(i);
  ASSIGN_OR_RETURN(DeviceBuffer positions,
                   ctx.device.device->Allocate(positions_.size() * sizeof(int32_t), ctx.stream(),
                                               MemoryKind::kActivations, ctx.device.memory));
  RETURN_IF_ERROR(ctx.stream().CopyToDevice(positions.byte_span(),
                                            std::as_bytes(std::span<const int32_t>(positions_))));
  const TokenIds position_ids{positions.span<const int32_t>(), positions_};
  RunContext pos_ctx = ctx;
  pos_ctx.ids = &position_ids;
  Tensor pos;
  RETURN_IF_ERROR(wpe_->Forward(Tensor(), pos, pos_ctx));
  // x[b*T + i, :] += pos[i, :]  (torch broadcasts pos over the batch)
  RETURN_IF_ERROR(ctx.stream().AddRowsModulo(x.span(), pos.span(), t));
  // Nothing below the embeddings reads ids.
  RunContext body_ctx = ctx;
  body_ctx.ids = nullptr;
  Tensor hidden;
  RETURN_IF_ERROR(h_->Forward(x, hidden, body_ctx));
  RETURN_IF_ERROR(ln_f_->Forward(hidden, x, body_ctx));
  return lm_head_->Forward(x, out, body_ctx);  // logits [B*T, V]
}

absl::Status GptLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  if (seq_ <= 0) return absl::FailedPreconditionError(Where() + "backward without a forward");
  Tensor dx;
  RETURN_IF_ERROR(lm_head_->Backward(dout, dx, ctx));
  Tensor dhidden;
  RETURN_IF_ERROR(ln_f_->Backward(dx, dhidden, ctx));
  RETURN_IF_ERROR(h_->Backward(dhidden, dx, ctx));
  // dpos[i, :] = sum over the batch of dx[b*T + i, :]
  ASSIGN_OR_RETURN(Tensor dpos, NewTensor(ctx.device, seq_, dx.cols));
  RETURN_IF_ERROR(ctx.stream().SumRowsModulo(dx.span(), seq_, dpos.span()));
  // Reverse execution order: wpe ran after wte, so its backward comes first.
  Tensor unused;
  RETURN_IF_ERROR(wpe_->Backward(dpos, unused, ctx));
  RETURN_IF_ERROR(wte_->Backward(dx, unused, ctx));
  seq_ = 0;
  din = Tensor();
  return absl::OkStatus();
}

}  // namespace flatshard::compute
