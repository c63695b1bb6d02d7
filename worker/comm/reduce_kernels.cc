#include "worker/comm/reduce_kernels.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace flatshard {
namespace {

template <typename T>
void Combine(ReduceOp op, const void* a, const void* b, void* out, size_t count) {
  // memcpy-free typed access: the buffers come from allocations of T.
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  T* z = static_cast<T*>(out);
  if (op == ReduceOp::kSum) {
    for (size_t i = 0; i < count; ++i) z[i] = static_cast<T>(x[i] + y[i]);
  } else {
    for (size_t i = 0; i < count; ++i) z[i] = std::max(x[i], y[i]);
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Combine16(ReduceOp op, const void* a, const void* b, void* out, size_t count) {
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  uint16_t* z = static_cast<uint16_t*>(out);
  for (size_t i = 0; i < count; ++i) {
    const float fx = ToFloat(x[i]);
    const float fy = ToFloat(y[i]);
    z[i] = FromFloat(op == ReduceOp::kSum ? fx + fy : std::max(fx, fy));
  }
}

}  // namespace

void ReduceElements(DType dtype, ReduceOp op, const void* a, const void* b, void* out,
                    size_t count) {
  switch (dtype) {
    case DType::kFloat32:
      return Combine<float>(op, a, b, out, count);
    case DType::kFloat64:
      return Combine<double>(op, a, b, out, count);
    case DType::kInt32:
      return Combine<int32_t>(op, a, b, out, count);
    case DType::kInt64:
      return Combine<int64_t>(op, a, b, out, count);
    case DType::kBFloat16:
      return Combine16<BFloat16ToFloat, FloatToBFloat16>(op, a, b, out, count);
    case DType::kFloat16:
      return Combine16<HalfToFloat, FloatToHalf>(op, a, b, out, count);
  }
}

void DivideElements(DType dtype, void* data, size_t count, double divisor) {
  switch (dtype) {
    case DType::kFloat32: {
      float* x = static_cast<float*>(data);
      const auto d = static_cast<float>(divisor);
      for (size_t i = 0; i < count; ++i) x[i] /= d;
      return;
    }
    case DType::kFloat64: {
      double* x = static_cast<double*>(data);
      for (size_t i = 0; i < count; ++i) x[i] /= divisor;
      return;
    }
    case DType::kBFloat16:
    case DType::kFloat16: {
      uint16_t* x = static_cast<uint16_t*>(data);
      const bool bf16 = dtype == DType::kBFloat16;
      const auto d = static_cast<float>(divisor);
      for (size_t i = 0; i < count; ++i) {
        const float v = (bf16 ? BFloat16ToFloat(x[i]) : HalfToFloat(x[i])) / d;
        x[i] = bf16 ? FloatToBFloat16(v) : FloatToHalf(v);
      }
      return;
    }
    case DType::kInt32:
    case DType::kInt64:
      return;  // gradients are never integral
  }
}

}  // namespace flatshard
