#include "core/dtype.h"

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

template <typename T>
T Load(const std::byte* data, size_t index) {
  T value;
  std::memcpy(&value, data + index * sizeof(T), sizeof(T));
  return value;
}

template <typename T>
void Store(std::byte* data, size_t index, T value) {
  std::memcpy(data + index * sizeof(T), &value, sizeof(T));
}

void WriteElement(DType dtype, std::byte* data, size_t index, double value) {
  switch (dtype) {
    case DType::kFloat32:
      Store(data, index, static_cast<float>(value));
      return;
    case DType::kFloat64:
      Store(data, index, value);
      return;
    case DType::kFloat16:
      Store(data, index, FloatToHalf(static_cast<float>(value)));
      return;
    case DType::kBFloat16:
      Store(data, index, FloatToBFloat16(static_cast<float>(value)));
      return;
    case DType::kInt32:
      Store(data, index, static_cast<int32_t>(value));
      return;
    case DType::kInt64:
      Store(data, index, static_cast<int64_t>(value));
      return;
  }
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
    case DType::kInt32:
      return 4;
    case DType::kFloat64:
    case DType::kInt64:
      return 8;
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
  }
  return 0;
}

bool IsFloating(DType dtype) {
  return dtype == DType::kFloat32 || dtype == DType::kFloat64 || dtype == DType::kFloat16 ||
         dtype == DType::kBFloat16;
}

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kFloat16:
      return "float16";
    case DType::kBFloat16:
      return "bfloat16";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
  }
  return "?";
}

absl::string_view SafetensorsDTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "F32";
    case DType::kFloat64:
      return "F64";
    case DType::kFloat16:
      return "F16";
    case DType::kBFloat16:
      return "BF16";
    case DType::kInt32:
      return "I32";
    case DType::kInt64:
      return "I64";
  }
  return "?";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  std::string lower(name);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return std::tolower(c); });
  if (lower.starts_with("torch.")) lower.erase(0, 6);
  struct Alias {
    absl::string_view name;
    DType dtype;
  };
  static constexpr Alias kAliases[] = {
      {"float32", DType::kFloat32},   {"f32", DType::kFloat32},     {"fp32", DType::kFloat32},
      {"float", DType::kFloat32},     {"float64", DType::kFloat64}, {"f64", DType::kFloat64},
      {"fp64", DType::kFloat64},      {"double", DType::kFloat64},  {"float16", DType::kFloat16},
      {"f16", DType::kFloat16},       {"fp16", DType::kFloat16},    {"half", DType::kFloat16},
      {"bfloat16", DType::kBFloat16}, {"bf16", DType::kBFloat16},   {"int32", DType::kInt32},
      {"i32", DType::kInt32},         {"int", DType::kInt32},       {"int64", DType::kInt64},
      {"i64", DType::kInt64},         {"long", DType::kInt64},
  };
  for (const Alias& alias : kAliases) {
    if (alias.name == lower) return alias.dtype;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name,
                   "'; expected one of float32, float64, float16, bfloat16, "
                   "int32, int64"));
}

absl::StatusOr<DType> ParseSafetensorsDType(absl::string_view name) {
  for (DType dtype : {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16,
                      DType::kInt32, DType::kInt64}) {
    if (SafetensorsDTypeName(dtype) == name) return dtype;
  }
  return absl::InvalidArgumentError(absl::StrCat("unsupported safetensors dtype '", name,
                                                 "'; expected F32, F64, F16, BF16, I32 or I64"));
}

double ReadElement(DType dtype, const std::byte* data, size_t index) {
  switch (dtype) {
    case DType::kFloat32:
      return Load<float>(data, index);
    case DType::kFloat64:
      return Load<double>(data, index);
    case DType::kFloat16:
      return HalfToFloat(Load<uint16_t>(data, index));
    case DType::kBFloat16:
      return BFloat16ToFloat(Load<uint16_t>(data, index));
    case DType::kInt32:
      return Load<int32_t>(data, index);
    case DType::kInt64:
      return static_cast<double>(Load<int64_t>(data, index));
  }
  return 0.0;
}

void ConvertElements(DType src_dtype, const std::byte* src, DType dst_dtype, std::byte* dst,
                     size_t count) {
  if (src_dtype == dst_dtype) {
    std::memmove(dst, src, count * DTypeSize(src_dtype));
    return;
  }
  // The common mixed-precision casts get tight loops; the rest go through double,
  // which is exact for every pair of the supported types except int64 > 2^53.
  if (src_dtype == DType::kFloat32 && dst_dtype == DType::kBFloat16) {
    for (size_t i = 0; i < count; ++i) {
      Store(dst, i, FloatToBFloat16(Load<float>(src, i)));
    }
  } else if (src_dtype == DType::kBFloat16 && dst_dtype == DType::kFloat32) {
    for (size_t i = 0; i < count; ++i) {
      Store(dst, i, BFloat16ToFloat(Load<uint16_t>(src, i)));
    }
  } else if (src_dtype == DType::kFloat32 && dst_dtype == DType::kFloat16) {
    for (size_t i = 0; i < count; ++i) {
      Store(dst, i, FloatToHalf(Load<float>(src, i)));
    }
  } else if (src_dtype == DType::kFloat16 && dst_dtype == DType::kFloat32) {
    for (size_t i = 0; i < count; ++i) {
      Store(dst, i, HalfToFloat(Load<uint16_t>(src, i)));
    }
  } else {
    // Through double. For float64 -> 16-bit this rounds twice (via float32), as
    // PyTorch's c10 casts do, so results match it bit for bit.
    for (size_t i = 0; i < count; ++i) {
      WriteElement(dst_dtype, dst, i, ReadElement(src_dtype, src, i));
    }
  }
}

void FillElements(DType dtype, double value, std::byte* dst, size_t count) {
  for (size_t i = 0; i < count; ++i) WriteElement(dtype, dst, i, value);
}

}  // namespace flatshard
