// Exact round-to-nearest-even conversions between float32 and the two 16-bit
// floats, bit for bit as PyTorch's CPU casts and CUDA's __float2bfloat16_rn /
// __float2half_rn: NaN stays NaN (quieted), infinities and signed zeros are kept,
// float16 overflow goes to infinity and float16 subnormals come out exactly.
// Written once for the host and the GPU (core/host_device.h), so the casts of
// the mixed-precision all-gather and gradient path are the same on every device.
#ifndef FLATSHARD_CORE_FLOAT16_H_
#define FLATSHARD_CORE_FLOAT16_H_

#include <cstdint>

#include "core/host_device.h"

namespace flatshard {

FLATSHARD_HOST_DEVICE inline uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) {
    // NaN: keep the sign and the top payload bits, force the quiet bit so a
    // payload living only in the low bits cannot turn into infinity.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Round to nearest, ties to even: add 0x7FFF plus the lowest kept bit.
  const uint32_t rounding_bias = 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

FLATSHARD_HOST_DEVICE inline float BFloat16ToFloat(uint16_t bits) {
  return FloatFromBits(static_cast<uint32_t>(bits) << 16);
}

FLATSHARD_HOST_DEVICE inline uint16_t FloatToHalf(float value) {
  // F. Giesen's float_to_half_fast3_rtne: exact round-to-nearest-even, including
  // subnormal results (done by letting the FPU round against a magic number;
  // both the host and the GPU add in round-to-nearest-even without flushing).
  constexpr uint32_t kF32Infinity = 255u << 23;
  constexpr uint32_t kF16Max = (127u + 16u) << 23;  // 2^16: first value -> inf
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t x = FloatBits(value);
  const uint32_t sign = x & 0x80000000u;
  x ^= sign;
  uint32_t out;
  if (x >= kF16Max) {
    out = x > kF32Infinity ? 0x7E00u : 0x7C00u;
  } else if (x < (113u << 23)) {  // below 2^-14: a half subnormal or zero
    const float f = FloatFromBits(x) + FloatFromBits(kDenormMagic);
    out = FloatBits(f) - kDenormMagic;
  } else {
    const uint32_t mantissa_odd = (x >> 13) & 1u;
    x += (static_cast<uint32_t>(15 - 127) << 23) + 0xFFFu;
    x += mantissa_odd;
    out = x >> 13;
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

FLATSHARD_HOST_DEVICE inline float HalfToFloat(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1Fu;
  const uint32_t mantissa = bits & 0x3FFu;
  if (exponent == 0) {
    // Zero or subnormal: mantissa * 2^-24 is exact in float.
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign != 0 ? -magnitude : magnitude;
  }
  if (exponent == 31) return FloatFromBits(sign | 0x7F800000u | (mantissa << 13));
  return FloatFromBits(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

}  // namespace flatshard

#endif  // FLATSHARD_CORE_FLOAT16_H_
