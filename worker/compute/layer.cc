#include "worker/compute/layer.h"

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard::compute {

absl::Status Layer::Forward(const Tensor& in, Tensor& out, const RunContext& ctx) {
  RETURN_IF_ERROR(ctx.hooks->BeforeForward(info_.module_index));
  RETURN_IF_ERROR(DoForward(in, out, ctx));
  return ctx.hooks->AfterForward(info_.module_index);
}

absl::Status Layer::Backward(const Tensor& dout, Tensor& din, const RunContext& ctx) {
  RETURN_IF_ERROR(ctx.hooks->BeforeBackward(info_.module_index));
  RETURN_IF_ERROR(DoBackward(dout, din, ctx));
  return ctx.hooks->AfterBackward(info_.module_index);
}

std::string Layer::Where() const {
  if (info_.fqn.empty()) return absl::StrCat("root module (", info_.type, "): ");
  return absl::StrCat("module '", info_.fqn, "' (", info_.type, "): ");
}

absl::StatusOr<ParamSlot> Layer::Resolve(const RunContext& ctx, const LayerParam& param) const {
  ParamSlot slot = ctx.params->Resolve(param.index);
  if (slot.value.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(), "parameter '", param.fqn, "' has no storage (is its FSDP unit unsharded?)"));
  }
  return slot;
}

absl::StatusOr<ParamSlot> Layer::ResolveOptional(const RunContext& ctx,
                                                 const LayerParam& param) const {
  if (!param.present()) return ParamSlot{};
  return Resolve(ctx, param);
}

absl::Status Layer::CheckCols(const Tensor& t, int64_t cols, const char* what) const {
  if (t.cols != cols || t.capacity_bytes() < t.size() * sizeof(float)) {
    return absl::InvalidArgumentError(absl::StrCat(Where(), what, " has shape [", t.rows, ", ",
                                                   t.cols, "], expected ", cols, " columns"));
  }
  return absl::OkStatus();
}

}  // namespace flatshard::compute
