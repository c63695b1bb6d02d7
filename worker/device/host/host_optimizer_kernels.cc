#include "worker/device/host/host_optimizer_kernels.h"

#include <type_traits>

// Built with -O3 -fno-math-errno -fno-trapping-math -ffp-contract=off
// (worker/CMakeLists.txt): vectorization needs the first three (sqrtf may not
// set errno; amsgrad's compares become selects only if they may not trap),
// and the last keeps the compiler from fusing a multiply and an add that
// torch rounds separately once FMA instructions are allowed. None changes a
// value: host_optimizer_kernels_test checks every copy bit for bit.

namespace flatshard::host_kernels {
namespace {

// The flags of a step become compile-time constants: the loop bodies below
// copy the coefficients and overwrite their flags with template arguments, so
// after inlining core/optimizer_update.h's element function every branch on
// them folds away and each loop is one straight line of vector code. The
// formulas stay written once.

template <bool kMaximize, bool kDecay, bool kMomentum, bool kFirst, bool kNesterov>
[[gnu::always_inline]] inline void SgdLoop(const SgdCoefficients& coefficients,
                                           float* __restrict params, const float* __restrict grads,
                                           float* __restrict momentum, size_t count) {
  SgdCoefficients c = coefficients;
  c.maximize = kMaximize;
  c.weight_decay = kDecay;
  c.momentum = kMomentum;
  c.first_momentum_step = kFirst;
  c.nesterov = kNesterov;
  if constexpr (kMomentum) {
    for (size_t i = 0; i < count; ++i) SgdUpdate(c, params[i], grads[i], momentum[i]);
  } else {
    for (size_t i = 0; i < count; ++i) {
      float unused = 0.0f;
      SgdUpdate(c, params[i], grads[i], unused);
    }
  }
}

template <bool kMaximize, bool kDecoupled, bool kL2, bool kAmsgrad>
[[gnu::always_inline]] inline void AdamLoop(const AdamCoefficients& coefficients,
                                            float* __restrict params, const float* __restrict grads,
                                            float* __restrict exp_avg, float* __restrict exp_avg_sq,
                                            float* __restrict max_exp_avg_sq, size_t count) {
  AdamCoefficients c = coefficients;
  c.maximize = kMaximize;
  c.decoupled = kDecoupled;
  c.l2 = kL2;
  c.amsgrad = kAmsgrad;
  if constexpr (kAmsgrad) {
    for (size_t i = 0; i < count; ++i) {
      AdamUpdate(c, params[i], grads[i], exp_avg[i], exp_avg_sq[i], max_exp_avg_sq[i]);
    }
  } else {
    for (size_t i = 0; i < count; ++i) {
      float unused = 0.0f;
      AdamUpdate(c, params[i], grads[i], exp_avg[i], exp_avg_sq[i], unused);
    }
  }
}

// One copy of each loop per instruction set: the same source, compiled for
// the baseline and for AVX2 + FMA.
template <bool... kFlags>
void SgdPortable(const SgdCoefficients& c, float* p, const float* g, float* m, size_t n) {
  SgdLoop<kFlags...>(c, p, g, m, n);
}
template <bool... kFlags>
void AdamPortable(const AdamCoefficients& c, float* p, const float* g, float* m, float* v,
                  float* vmax, size_t n) {
  AdamLoop<kFlags...>(c, p, g, m, v, vmax, n);
}

#if defined(__x86_64__) && defined(__GNUC__)
#define FLATSHARD_HAVE_AVX2_FMA 1
template <bool... kFlags>
[[gnu::target("avx2,fma")]] void SgdAvx2Fma(const SgdCoefficients& c, float* p, const float* g,
                                            float* m, size_t n) {
  SgdLoop<kFlags...>(c, p, g, m, n);
}
template <bool... kFlags>
[[gnu::target("avx2,fma")]] void AdamAvx2Fma(const AdamCoefficients& c, float* p, const float* g,
                                             float* m, float* v, float* vmax, size_t n) {
  AdamLoop<kFlags...>(c, p, g, m, v, vmax, n);
}
#else
#define FLATSHARD_HAVE_AVX2_FMA 0
#endif

// Calls fn(std::bool_constant<flags[0]>{}, ...): the step's runtime flags
// turned into template arguments, one instantiation per combination.
template <size_t N, typename Fn>
void Dispatch(const bool (&flags)[N], Fn&& fn) {
  auto step = [&](auto self, auto index, auto... fixed) {
    if constexpr (decltype(index)::value == N) {
      fn(fixed...);
    } else {
      constexpr size_t kI = decltype(index)::value;
      using Next = std::integral_constant<size_t, kI + 1>;
      if (flags[kI]) {
        self(self, Next{}, fixed..., std::true_type{});
      } else {
        self(self, Next{}, fixed..., std::false_type{});
      }
    }
  };
  step(step, std::integral_constant<size_t, 0>{});
}

}  // namespace

void SgdStep(const SgdCoefficients& c, float* params, const float* grads, float* momentum,
             size_t count, HostIsa isa) {
  const bool avx2 = UseAvx2Fma(isa);
  const bool flags[] = {c.maximize, c.weight_decay, c.momentum && momentum != nullptr,
                        c.first_momentum_step, c.nesterov};
  Dispatch(flags, [&](auto... f) {
#if FLATSHARD_HAVE_AVX2_FMA
    if (avx2) {
      SgdAvx2Fma<decltype(f)::value...>(c, params, grads, momentum, count);
      return;
    }
#endif
    (void)avx2;
    SgdPortable<decltype(f)::value...>(c, params, grads, momentum, count);
  });
}

void AdamStep(const AdamCoefficients& c, float* params, const float* grads, float* exp_avg,
              float* exp_avg_sq, float* max_exp_avg_sq, size_t count, HostIsa isa) {
  const bool avx2 = UseAvx2Fma(isa);
  const bool flags[] = {c.maximize, c.decoupled, c.l2, c.amsgrad && max_exp_avg_sq != nullptr};
  Dispatch(flags, [&](auto... f) {
#if FLATSHARD_HAVE_AVX2_FMA
    if (avx2) {
      AdamAvx2Fma<decltype(f)::value...>(c, params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                         count);
      return;
    }
#endif
    (void)avx2;
    AdamPortable<decltype(f)::value...>(c, params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq,
                                        count);
  });
}

}  // namespace flatshard::host_kernels
