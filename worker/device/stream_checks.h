// Argument checks shared by every Stream implementation, so a bad shape is the
// same INVALID_ARGUMENT ("Gemm: operand b holds 12 floats, needs 16") on every
// device and nothing is enqueued. Pure functions of the arguments.
#ifndef FLATSHARD_WORKER_DEVICE_STREAM_CHECKS_H_
#define FLATSHARD_WORKER_DEVICE_STREAM_CHECKS_H_

#include <cstddef>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

#include "core/dtype.h"
#include "worker/device/stream.h"

namespace flatshard::stream_checks {

// The dtypes gradients are reduced in: float32, bfloat16, float16.
bool IsGradientDtype(DType dtype);

// INVALID_ARGUMENT "<op>: <problem>" unless `ok`.
absl::Status Check(bool ok, absl::string_view op, absl::string_view problem);

absl::Status CheckCast(DType src_dtype, DeviceSpan<const std::byte> src, DType dst_dtype,
                       DeviceSpan<std::byte> dst, size_t count);
absl::Status CheckPrepareGrad(DeviceSpan<const float> grad, DType reduce_dtype,
                              DeviceSpan<std::byte> out, size_t out_count);
absl::Status CheckAccumulateReduced(DType reduce_dtype, DeviceSpan<const std::byte> reduced,
                                    DeviceSpan<float> acc);
absl::Status CheckGemm(const GemmArgs& args);
// `total` elements are whole rows of `cols` (cols > 0 unless total is 0).
absl::Status CheckRows(absl::string_view op, size_t total, size_t cols);
// x of `total` elements against a table of `period` rows of table_size/period.
absl::Status CheckModulo(absl::string_view op, size_t total, size_t table_size, int64_t period);
absl::Status CheckLayerNorm(size_t x_size, int64_t dim, DeviceSpan<const float> weight,
                            DeviceSpan<const float> bias, DeviceSpan<float> y,
                            DeviceSpan<float> xhat, DeviceSpan<float> rstd);
absl::Status CheckLayerNormBackward(DeviceSpan<const float> dy, DeviceSpan<const float> xhat,
                                    DeviceSpan<const float> rstd, DeviceSpan<const float> weight,
                                    DeviceSpan<float> dx, DeviceSpan<float> weight_grad,
                                    DeviceSpan<float> bias_grad);
absl::Status CheckEmbedding(absl::string_view op, DeviceSpan<const int32_t> ids, size_t table_size,
                            int64_t dim, size_t rows_size);
absl::Status CheckHeads(absl::string_view op, size_t rows_size, const HeadLayout& layout,
                        size_t heads_size);
// `size` elements are whole [seq, seq] matrices, and `other_size` the same.
absl::Status CheckSquares(absl::string_view op, size_t size, int64_t seq, size_t other_size);
absl::Status CheckMse(DeviceSpan<const float> out, DeviceSpan<const float> target,
                      DeviceSpan<float> grad, DeviceSpan<double> loss);
absl::Status CheckCrossEntropy(DeviceSpan<const float> logits, int64_t classes,
                               DeviceSpan<const int32_t> labels, DeviceSpan<float> grad,
                               DeviceSpan<double> loss);

}  // namespace flatshard::stream_checks

#endif  // FLATSHARD_WORKER_DEVICE_STREAM_CHECKS_H_
