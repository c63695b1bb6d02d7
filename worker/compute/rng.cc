#include "worker/compute/rng.h"

#include <cmath>

namespace flatshard::compute {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio, SplitMix's step
constexpr double kLn2 = 0.693147180559945309417232121458;
constexpr double kSqrtHalf = 0.707106781186547524400844362105;
constexpr double kHalfPi = 1.57079632679489661923132169164;

// cos(x) and sin(x) for |x| <= pi/4 by their Taylor series; the terms up to
// x^20 / 20! bring the truncation error below 1e-19 there.
double CosSeries(double x) {
  const double x2 = x * x;
  double sum = 1.0;
  double term = 1.0;
  for (int k = 1; k <= 10; ++k) {
    term *= -x2 / static_cast<double>((2 * k - 1) * (2 * k));
    sum += term;
  }
  return sum;
}

double SinSeries(double x) {
  const double x2 = x * x;
  double sum = x;
  double term = x;
  for (int k = 1; k <= 10; ++k) {
    term *= -x2 / static_cast<double>((2 * k) * (2 * k + 1));
    sum += term;
  }
  return sum;
}

}  // namespace

uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + kGolden;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

CounterRng CounterRng::Fork(uint64_t tag) const {
  return CounterRng(SplitMix64(key_ ^ SplitMix64(tag ^ 0x5EEDF0124Bull)));
}

CounterRng CounterRng::Fork(absl::string_view tag) const {
  uint64_t hash = 0xCBF29CE484222325ull;  // FNV-1a 64
  for (char c : tag) {
    hash ^= static_cast<uint8_t>(c);
    hash *= 0x100000001B3ull;
  }
  return Fork(hash);
}

uint64_t CounterRng::Bits(uint64_t n) const { return SplitMix64(key_ ^ SplitMix64(n)); }

double CounterRng::Uniform(uint64_t n) const {
  return static_cast<double>(Bits(n) >> 11) * 0x1.0p-53;
}

uint64_t CounterRng::Below(uint64_t n, uint64_t bound) const { return Bits(n) % bound; }

double CounterRng::Normal(uint64_t n) const {
  // u1 in (0, 1] so the log is finite; u2 in [0, 1).
  const double u1 = static_cast<double>((Bits(2 * n) >> 11) + 1) * 0x1.0p-53;
  const double u2 = static_cast<double>(Bits(2 * n + 1) >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * PortableLog(u1)) * PortableCos2Pi(u2);  // sqrt is exact in IEEE
}

double PortableLog(double x) {
  // x = m * 2^e with m in [sqrt(1/2), sqrt(2)); log(m) = 2 atanh(s), s = (m-1)/(m+1),
  // |s| < 0.172, summed as 2 s (1 + s^2/3 + s^4/5 + ...) to s^24.
  int e = 0;
  double m = std::frexp(x, &e);  // exact: m in [0.5, 1)
  if (m < kSqrtHalf) {
    m *= 2.0;
    --e;
  }
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  double poly = 1.0 / 25.0;
  for (int k = 11; k >= 0; --k) poly = poly * s2 + 1.0 / static_cast<double>(2 * k + 1);
  return static_cast<double>(e) * kLn2 + 2.0 * s * poly;
}

double PortableCos2Pi(double v) {
  // 2 pi v = (quadrant + f) * pi/2 with f in [0, 1); both steps are exact for
  // v a multiple of 2^-53 in [0, 1).
  const double r = v * 4.0;
  const double quadrant = std::floor(r);
  const double f = r - quadrant;
  // cos and sin of f * pi/2, folding f > 1/2 onto 1 - f to stay within pi/4.
  const double g = f <= 0.5 ? f : 1.0 - f;
  double c = CosSeries(g * kHalfPi);
  double s = SinSeries(g * kHalfPi);
  if (f > 0.5) {
    const double swap = c;
    c = s;
    s = swap;
  }
  switch (static_cast<int>(quadrant) & 3) {
    case 0:
      return c;
    case 1:
      return -s;
    case 2:
      return -c;
    default:
      return s;
  }
}

}  // namespace flatshard::compute
