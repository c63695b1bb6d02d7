// A counter-based random number generator: value `n` of stream `key` is a pure
// function of (key, n), so any rank can compute any sample or any slice of a
// parameter without generating what comes before it, and every platform gets
// the same bits. Built from SplitMix64's finaliser; the normal draws use
// Box-Muller with a log and a cosine written out in plain double arithmetic
// (libm's transcendental functions differ between platforms in the last bit).
// Not for cryptography.
#ifndef FLATSHARD_WORKER_COMPUTE_RNG_H_
#define FLATSHARD_WORKER_COMPUTE_RNG_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace flatshard::compute {

// SplitMix64's output function (Steele, Lea, Flood 2014): a bijection that
// scrambles all 64 bits.
uint64_t SplitMix64(uint64_t x);

class CounterRng {
 public:
  explicit CounterRng(uint64_t key) : key_(key) {}

  // Independent sub-streams, e.g. CounterRng(seed).Fork("inputs").Fork(sample).
  CounterRng Fork(uint64_t tag) const;
  CounterRng Fork(absl::string_view tag) const;  // FNV-1a of the bytes, then Fork

  uint64_t key() const { return key_; }

  // 64 random bits, the n-th of the stream.
  uint64_t Bits(uint64_t n) const;
  // Uniform in [0, 1) with 53 random bits.
  double Uniform(uint64_t n) const;
  // Uniform integer in [0, bound), bound > 0 (modulo bias below 2^-40 for the
  // sizes used here).
  uint64_t Below(uint64_t n, uint64_t bound) const;
  // Standard normal: Box-Muller from Bits(2n) and Bits(2n + 1), cosine branch.
  double Normal(uint64_t n) const;

 private:
  uint64_t key_;
};

// log(x) for x > 0 and cos(2 pi v) for v in [0, 1), to within a few ulp, from
// +, -, *, / only, so the results are the same on every IEEE-754 platform.
double PortableLog(double x);
double PortableCos2Pi(double v);

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_RNG_H_
