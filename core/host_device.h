// The annotation that lets one arithmetic body serve every device: a function
// marked FLATSHARD_HOST_DEVICE compiles for the host with g++ (where the macro is
// empty) and for both host and GPU with nvcc. Kernel bodies, the 16-bit float
// conversions and the optimizer updates are written once this way, so the
// arithmetic the GPU runs is the arithmetic the host and simulated devices run
// and the CPU tests check (docs/architecture.md §5).
//
// Only header-inline, allocation-free, exception-free code belongs behind it; it
// never touches a device runtime, so core stays pure.
#ifndef FLATSHARD_CORE_HOST_DEVICE_H_
#define FLATSHARD_CORE_HOST_DEVICE_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FLATSHARD_HOST_DEVICE __host__ __device__
#else
#define FLATSHARD_HOST_DEVICE
#endif

namespace flatshard {

// std::bit_cast between float and its bits, usable in device code too.
FLATSHARD_HOST_DEVICE inline uint32_t FloatBits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

FLATSHARD_HOST_DEVICE inline float FloatFromBits(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

}  // namespace flatshard

#endif  // FLATSHARD_CORE_HOST_DEVICE_H_
