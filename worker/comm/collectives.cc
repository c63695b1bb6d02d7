#include "worker/comm/collectives.h"

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"
#include "worker/device/stream_checks.h"

namespace flatshard {

absl::Status CheckCollectiveSizes(absl::string_view op, size_t input_bytes, size_t in_count,
                                  size_t output_bytes, size_t out_count, DType dtype) {
  const size_t element = DTypeSize(dtype);
  if (input_bytes < in_count * element || output_bytes < out_count * element) {
    return absl::InvalidArgumentError(
        absl::StrCat(op, ": buffers of ", input_bytes, " and ", output_bytes, " bytes cannot hold ",
                     in_count, " and ", out_count, " ", DTypeName(dtype), " elements"));
  }
  return absl::OkStatus();
}

absl::Status CheckGradientReduction(const GradientReduction& r, int group_size) {
  const size_t total = r.count * static_cast<size_t>(group_size);
  if (!stream_checks::IsGradientDtype(r.reduce_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("ReduceGradient: reduce_dtype ",
                                                   DTypeName(r.reduce_dtype),
                                                   " is not float32, bfloat16 or float16"));
  }
  if (r.grad.size() > total) {
    return absl::InvalidArgumentError(absl::StrCat("ReduceGradient: grad holds ", r.grad.size(),
                                                   " elements, more than the ", total,
                                                   " of the padded input"));
  }
  if (r.work.size() < total * DTypeSize(r.reduce_dtype)) {
    return absl::InvalidArgumentError(absl::StrCat("ReduceGradient: work holds ", r.work.size(),
                                                   " bytes, not ", total, " ",
                                                   DTypeName(r.reduce_dtype), " elements"));
  }
  // The reduction may run in place on the gradient's own buffer: element i
  // is read before it is written, so only a float32 work buffer that starts
  // where the gradient does can share its memory.
  const auto* grad = reinterpret_cast<const std::byte*>(r.grad.address());
  const std::byte* work = r.work.address();
  const bool overlap = grad < work + r.work.size() && work < grad + r.grad.size_bytes();
  if (overlap && (r.reduce_dtype != DType::kFloat32 || grad != work)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ReduceGradient: work overlaps grad; only a float32 reduction may share the gradient's "
        "buffer, starting where it starts (reduce_dtype ",
        DTypeName(r.reduce_dtype), ", work at grad + ", work - grad, " bytes)"));
  }
  if (r.grad_shard.size() != r.count) {
    return absl::InvalidArgumentError(absl::StrCat("ReduceGradient: grad_shard holds ",
                                                   r.grad_shard.size(), " elements, the shard ",
                                                   r.count));
  }
  return absl::OkStatus();
}

absl::Status Collectives::ReduceGradient(Stream& stream, const GradientReduction& r) {
  RETURN_IF_ERROR(CheckGradientReduction(r, size()));
  if (!r.accumulate) RETURN_IF_ERROR(stream.Zero(AsWritableBytes(r.grad_shard)));
  const size_t total = r.count * static_cast<size_t>(size());
  const size_t bytes = r.count * DTypeSize(r.reduce_dtype);
  RETURN_IF_ERROR(stream.PrepareGradForReduce(r.grad, r.reduce_dtype, r.work, total, r.pre_divide));
  RETURN_IF_ERROR(ReduceScatterInPlace(stream, r.work, r.count, r.reduce_dtype));
  return stream.AccumulateReducedGrad(r.reduce_dtype,
                                      r.work.subspan(static_cast<size_t>(rank()) * bytes, bytes),
                                      r.grad_shard, r.post_divide);
}

}  // namespace flatshard
