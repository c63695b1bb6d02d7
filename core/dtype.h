// Element types of parameters and buffers, their sizes and names, and the exact
// round-to-nearest-even conversions between float32 and the 16-bit floats. Pure
// arithmetic: never touches a device.
#ifndef FLATSHARD_CORE_DTYPE_H_
#define FLATSHARD_CORE_DTYPE_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/float16.h"

namespace flatshard {

enum class DType : uint8_t {
  kFloat32,
  kFloat64,
  kFloat16,
  kBFloat16,
  kInt32,
  kInt64,
};

// Size of one element in bytes.
size_t DTypeSize(DType dtype);

// Only floating dtypes can hold trainable (sharded, reduced) parameters.
bool IsFloating(DType dtype);

// PyTorch's spelling without the "torch." prefix: "float32", "bfloat16", ...
absl::string_view DTypeName(DType dtype);

// safetensors' spelling: "F32", "F64", "F16", "BF16", "I32", "I64".
absl::string_view SafetensorsDTypeName(DType dtype);

// Accepts the PyTorch names and their common aliases (f32, fp32, float, bf16,
// half, double, ...), case-insensitively.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// Accepts exactly the safetensors names.
absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name);

// The float32 <-> 16-bit conversions (FloatToBFloat16, HalfToFloat, ...) live in
// core/float16.h, shared with the device kernels.

// Converts `count` elements between any two floating dtypes (through float32 for
// the 16-bit types, through double otherwise). `src` and `dst` hold raw element
// bytes in little-endian order and must be at least count * DTypeSize bytes.
void ConvertElements(DType src_dtype, const std::byte* src, DType dst_dtype, std::byte* dst,
                     size_t count);

// Writes `count` copies of `value` converted to `dtype`.
void FillElements(DType dtype, double value, std::byte* dst, size_t count);

// Reads element `index` as a double (any dtype).
double ReadElement(DType dtype, const std::byte* data, size_t index);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_DTYPE_H_
