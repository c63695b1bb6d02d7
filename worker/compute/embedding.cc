#include "worker/compute/embedding.h"

#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard::compute {

EmbeddingLayer::EmbeddingLayer(LayerInfo info, LayerParam weight, int64_t num_embeddings,
                               int64_t dim)
    : Layer(std::move(info)), weight_(std::move(weight)), num_(num_embeddings), dim_(dim) {}

absl::Status EmbeddingLayer::DoForward(const Tensor&, Tensor& out, const RunContext& ctx) {
  if (ctx.ids == nullptr) {
    return absl::InvalidArgumentError(Where() + "needs token ids as input, but the batch has none");
  }
  const std::span<const int32_t> host_ids = ctx.ids->host;
  for (size_t i = 0; i < host_ids.size(); ++i) {
    if (host_ids[i] < 0 || host_ids[i] >= num_) {
      return absl::InvalidArgumentError(absl::StrCat(
          Where(), "token id ", host_ids[i], " at position ", i, " is outside [0, ", num_, ")"));
    }
  }
  ASSIGN_OR_RETURN(const ParamSlot w, Resolve(ctx, weight_));
  const auto n = static_cast<int64_t>(host_ids.size());
  ASSIGN_OR_RETURN(out, NewTensor(ctx.device, n, dim_));
  // out[i, :] = W[ids[i], :]
  RETURN_IF_ERROR(ctx.stream().EmbeddingForward(ctx.ids->device, w.value, dim_, out.span()));
  // Backward needs the ids after the batch is gone: keep a device copy.
  num_ids_ = host_ids.size();
  ASSIGN_OR_RETURN(ids_, ctx.device.device->Allocate(num_ids_ * sizeof(int32_t), ctx.stream(),
                                                     MemoryKind::kActivations, ctx.device.memory));
  return ctx.stream().Copy(ids_.byte_span(), AsBytes(ctx.ids->device));
}

absl::Status EmbeddingLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  RETURN_IF_ERROR(CheckCols(dout, dim_, "output gradient"));
  if (dout.rows != static_cast<int64_t>(num_ids_)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), "output gradient has ", dout.rows,
                                                   " rows for ", num_ids_, " forward ids"));
  }
  ASSIGN_OR_RETURN(const ParamSlot w, Resolve(ctx, weight_));
  if (!w.grad.empty() && dout.rows > 0) {
    // dW[ids[i], :] += dout[i, :], in row order per id
    RETURN_IF_ERROR(ctx.stream().EmbeddingBackward(ids_.span<const int32_t>().first(num_ids_),
                                                   dout.span(), dim_, w.grad));
  }
  din = Tensor();
  ids_.Release();
  num_ids_ = 0;
  return absl::OkStatus();
}

}  // namespace flatshard::compute
