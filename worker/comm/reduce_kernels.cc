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

// The 16-bit combines are bound by their conversions (rounding, NaN selects),
// not by memory: written once and inlined into a baseline copy and an AVX2
// copy, chosen at run time, as the fused gradient reduction's loops are. The
// same operations per element, so both give the same bits
// (reduce_kernels_test). `z` may be `x`.
template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
[[gnu::always_inline]] inline void Combine16Loop(ReduceOp op, const uint16_t* x, const uint16_t* y,
                                                 uint16_t* z, size_t count) {
  if (op == ReduceOp::kSum) {
    for (size_t i = 0; i < count; ++i) z[i] = FromFloat(ToFloat(x[i]) + ToFloat(y[i]));
  } else {
    for (size_t i = 0; i < count; ++i) z[i] = FromFloat(std::max(ToFloat(x[i]), ToFloat(y[i])));
  }
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Combine16Portable(ReduceOp op, const uint16_t* x, const uint16_t* y, uint16_t* z,
                       size_t count) {
  Combine16Loop<ToFloat, FromFloat>(op, x, y, z, count);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
FLATSHARD_AVX2_COPY void Combine16Avx2(ReduceOp op, const uint16_t* x, const uint16_t* y,
                                       uint16_t* z, size_t count) {
  Combine16Loop<ToFloat, FromFloat>(op, x, y, z, count);
}

template <float (*ToFloat)(uint16_t), uint16_t (*FromFloat)(float)>
void Combine16(ReduceOp op, const void* a, const void* b, void* out, size_t count,
               host_kernels::HostIsa isa) {
  const auto* x = static_cast<const uint16_t*>(a);
  const auto* y = static_cast<const uint16_t*>(b);
  auto* z = static_cast<uint16_t*>(out);
  if (host_kernels::UseAvx2Fma(isa)) return Combine16Avx2<ToFloat, FromFloat>(op, x, y, z, count);
  Combine16Portable<ToFloat, FromFloat>(op, x, y, z, count);
}

}  // namespace

void ReduceElements(DType dtype, ReduceOp op, const void* a, const void* b, void* out, size_t count,
                    host_kernels::HostIsa isa) {
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
      return Combine16<BFloat16ToFloat, FloatToBFloat16>(op, a, b, out, count, isa);
    case DType::kFloat16:
      return Combine16<HalfToFloat, FloatToHalf>(op, a, b, out, count, isa);
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
