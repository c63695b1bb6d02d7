#include "worker/compute/embedding.h"

#include <algorithm>
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
  const std::vector<int32_t>& ids = *ctx.ids;
  for (size_t i = 0; i < ids.size(); ++i) {
    if (ids[i] < 0 || ids[i] >= num_) {
      return absl::InvalidArgumentError(absl::StrCat(Where(), "token id ", ids[i], " at position ",
                                                     i, " is outside [0, ", num_, ")"));
    }
  }
  ASSIGN_OR_RETURN(const ParamSlot w, Resolve(ctx, weight_));
  const auto n = static_cast<int64_t>(ids.size());
  ResizeZero(out, n, dim_);
  // out[i, :] = W[ids[i], :]
  for (int64_t i = 0; i < n; ++i) {
    const float* row = w.value + int64_t{ids[static_cast<size_t>(i)]} * dim_;
    std::copy(row, row + dim_, out.Row(i));
  }
  ids_ = ids;
  return absl::OkStatus();
}

absl::Status EmbeddingLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  RETURN_IF_ERROR(CheckCols(dout, dim_, "output gradient"));
  if (dout.rows != static_cast<int64_t>(ids_.size())) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), "output gradient has ", dout.rows,
                                                   " rows for ", ids_.size(), " forward ids"));
  }
  ASSIGN_OR_RETURN(const ParamSlot w, Resolve(ctx, weight_));
  if (w.grad != nullptr) {
    // dW[ids[i], :] += dout[i, :]
    for (int64_t i = 0; i < dout.rows; ++i) {
      float* g = w.grad + int64_t{ids_[static_cast<size_t>(i)]} * dim_;
      const float* dy = dout.Row(i);
      for (int64_t j = 0; j < dim_; ++j) g[j] += dy[j];
    }
  }
  din = Tensor();
  ids_.clear();
  return absl::OkStatus();
}

}  // namespace flatshard::compute
