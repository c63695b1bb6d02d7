#include "worker/comm/gradient_chunks.h"

#include <algorithm>
#include <cstdint>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FLATSHARD_STREAMING_STORES 1
#endif

#include "worker/device/host/host_isa.h"
#include "worker/device/kernels/element_ops.h"

namespace flatshard {
namespace {

using kernels::Element;

template <DType D>
using StorageOf = typename Element<D>::Storage;

// ReduceElements' SUM: in float32, 16-bit types rounded back.
template <DType D>
[[gnu::always_inline]] inline StorageOf<D> Add(StorageOf<D> mine, StorageOf<D> theirs) {
  return Element<D>::FromFloat(Element<D>::ToFloat(mine) + Element<D>::ToFloat(theirs));
}

// A gradient shard at least this large is written with streaming stores when
// the reduction writes it rather than accumulates into it: the optimizer reads
// it only after the rest of the backward pass, by when a shard this size has
// left the cache anyway (each core here has 1 MiB of L2, the ranks share the
// L3), so bringing its lines in first would buy nothing.
constexpr size_t kStreamShardBytes = size_t{4} << 20;

// The element loops, written once and inlined into a baseline copy and an
// AVX2 copy below (as the optimizer's passes are): the 16-bit conversions'
// rounding and NaN selects are most of a bf16 reduction's CPU time, and AVX2
// does them 8 lanes at a time. Element for element the same operations, so
// both copies give the same bits (gradient_chunks_test). `o` may be `g`
// itself (an fp32 reduction in place), so nothing here is __restrict.
template <DType D, typename Pre>
[[gnu::always_inline]] inline void ProduceLoop(const float* g, size_t valid, size_t n,
                                               StorageOf<D>* o, Pre pre) {
  for (size_t i = 0; i < valid; ++i) o[i] = kernels::PrepareGradValue<D>(g[i], pre);
  for (size_t i = valid; i < n; ++i) o[i] = Element<D>::FromFloat(0.0f);
}

// A float32 RawChunk as Produce would have written it (no padding inside).
template <typename Pre>
[[gnu::always_inline]] inline void FinishRawLoop(float* v, size_t n, Pre pre) {
  for (size_t i = 0; i < n; ++i) v[i] = kernels::PrepareGradValue<DType::kFloat32>(v[i], pre);
}

template <DType D, typename Pre>
[[gnu::always_inline]] inline void AddLoop(const float* g, size_t valid, size_t n,
                                           const StorageOf<D>* r, StorageOf<D>* o, Pre pre) {
  for (size_t i = 0; i < valid; ++i) o[i] = Add<D>(kernels::PrepareGradValue<D>(g[i], pre), r[i]);
  const StorageOf<D> zero = Element<D>::FromFloat(0.0f);
  for (size_t i = valid; i < n; ++i) o[i] = Add<D>(zero, r[i]);
}

// The sender's gradient as it is (RawChunk: float32, no padding).
template <DType D, typename Pre>
[[gnu::always_inline]] inline void AddRawLoop(const float* g, size_t n, const float* r,
                                              StorageOf<D>* o, Pre pre) {
  for (size_t i = 0; i < n; ++i) {
    o[i] = Add<D>(kernels::PrepareGradValue<D>(g[i], pre), kernels::PrepareGradValue<D>(r[i], pre));
  }
}

template <DType D, typename Post>
[[gnu::always_inline]] inline void ConsumeLoop(const StorageOf<D>* r, float* acc, size_t n,
                                               bool accumulate, Post post) {
  if (accumulate) {
    for (size_t i = 0; i < n; ++i) kernels::AccumulateReducedElement<D>(r, acc, post, i);
  } else {
    for (size_t i = 0; i < n; ++i) kernels::AssignReducedElement<D>(r, acc, post, i);
  }
}

template <DType D, typename Pre>
void ProducePortable(const float* g, size_t valid, size_t n, StorageOf<D>* o, Pre pre) {
  ProduceLoop<D>(g, valid, n, o, pre);
}
template <typename Pre>
void FinishRawPortable(float* v, size_t n, Pre pre) {
  FinishRawLoop(v, n, pre);
}
template <DType D, typename Pre>
void AddPortable(const float* g, size_t valid, size_t n, const StorageOf<D>* r, StorageOf<D>* o,
                 Pre pre) {
  AddLoop<D>(g, valid, n, r, o, pre);
}
template <DType D, typename Pre>
void AddRawPortable(const float* g, size_t n, const float* r, StorageOf<D>* o, Pre pre) {
  AddRawLoop<D>(g, n, r, o, pre);
}
template <DType D, typename Post>
void ConsumePortable(const StorageOf<D>* r, float* acc, size_t n, bool accumulate, Post post) {
  ConsumeLoop<D>(r, acc, n, accumulate, post);
}

template <DType D, typename Pre>
FLATSHARD_AVX2_COPY void ProduceAvx2(const float* g, size_t valid, size_t n, StorageOf<D>* o,
                                     Pre pre) {
  ProduceLoop<D>(g, valid, n, o, pre);
}
template <typename Pre>
FLATSHARD_AVX2_COPY void FinishRawAvx2(float* v, size_t n, Pre pre) {
  FinishRawLoop(v, n, pre);
}
template <DType D, typename Pre>
FLATSHARD_AVX2_COPY void AddAvx2(const float* g, size_t valid, size_t n, const StorageOf<D>* r,
                                 StorageOf<D>* o, Pre pre) {
  AddLoop<D>(g, valid, n, r, o, pre);
}
template <DType D, typename Pre>
FLATSHARD_AVX2_COPY void AddRawAvx2(const float* g, size_t n, const float* r, StorageOf<D>* o,
                                    Pre pre) {
  AddRawLoop<D>(g, n, r, o, pre);
}
template <DType D, typename Post>
FLATSHARD_AVX2_COPY void ConsumeAvx2(const StorageOf<D>* r, float* acc, size_t n, bool accumulate,
                                     bool stream, Post post) {
#ifdef FLATSHARD_STREAMING_STORES
  if (!accumulate && stream) {
    // A shard that is written, not accumulated, goes around the cache: an
    // ordinary store first reads every line it fills (write-allocate), one
    // more pass over the shard than the reduction needs. Each tile is formed
    // by the same loop in L1 (so the same bits), then streamed out.
    constexpr size_t kTile = 256;
    constexpr size_t kLane = 8;  // floats per 32-byte streaming store
    const size_t misaligned = reinterpret_cast<uintptr_t>(acc) % 32 / sizeof(float);
    const size_t head = std::min(n, misaligned == 0 ? 0 : kLane - misaligned);
    ConsumeLoop<D>(r, acc, head, false, post);
    alignas(32) float tile[kTile];
    for (size_t i = head; i < n; i += kTile) {
      const size_t m = std::min(kTile, n - i);
      ConsumeLoop<D>(r + i, tile, m, false, post);
      size_t j = 0;
      for (; j + kLane <= m; j += kLane) _mm256_stream_ps(acc + i + j, _mm256_load_ps(tile + j));
      for (; j < m; ++j) acc[i + j] = tile[j];
    }
    // Streaming stores are weakly ordered: they reach memory before whatever
    // tells another thread that the shard is ready.
    _mm_sfence();
    return;
  }
#endif
  (void)stream;
  ConsumeLoop<D>(r, acc, n, accumulate, post);
}

// The divisors' cases are template arguments, decided once per reduction: a
// per-element branch would keep these loops (one pass over every gradient
// each) from being straight lines.
template <DType D, typename Pre, typename Post>
class GradientChunks final : public ReduceScatterChunks {
 public:
  using Storage = StorageOf<D>;

  GradientChunks(const GradientChunksSpec& spec, Pre pre, Post post)
      : spec_(spec),
        pre_(pre),
        post_(post),
        avx2_(host_kernels::UseAvx2Fma(spec.isa)),
        stream_(spec.count * sizeof(float) >= kStreamShardBytes) {}

  // A float32 chunk wholly inside the gradient goes out as the gradient's own
  // bytes; its receiver applies the pre-divide (ProduceAndAdd).
  const std::byte* RawChunk(size_t chunk) override {
    if (D != DType::kFloat32 || (chunk + 1) * spec_.count > spec_.grad_count) return nullptr;
    return reinterpret_cast<const std::byte*>(spec_.grad + chunk * spec_.count);
  }

  void Produce(size_t chunk, size_t begin, size_t n, std::byte* out) override {
    auto* o = reinterpret_cast<Storage*>(out);
    const size_t first = chunk * spec_.count + begin;
    const float* g = spec_.grad + first;
    if (avx2_) return ProduceAvx2<D>(g, Valid(first, n), n, o, pre_);
    ProducePortable<D>(g, Valid(first, n), n, o, pre_);
  }

  // Only float32 chunks are ever raw (RawChunk).
  void FinishRaw(size_t /*chunk*/, size_t /*begin*/, size_t n, std::byte* values) override {
    if constexpr (D == DType::kFloat32) {
      auto* v = reinterpret_cast<float*>(values);
      if (avx2_) return FinishRawAvx2(v, n, pre_);
      FinishRawPortable(v, n, pre_);
    }
  }

  void ProduceAndAdd(size_t chunk, size_t begin, size_t n, const std::byte* received,
                     bool received_raw, std::byte* out) override {
    auto* o = reinterpret_cast<Storage*>(out);
    const size_t first = chunk * spec_.count + begin;
    const float* g = spec_.grad + first;
    if (received_raw) {
      const auto* r = reinterpret_cast<const float*>(received);
      if (avx2_) return AddRawAvx2<D>(g, n, r, o, pre_);
      return AddRawPortable<D>(g, n, r, o, pre_);
    }
    const auto* r = reinterpret_cast<const Storage*>(received);
    if (avx2_) return AddAvx2<D>(g, Valid(first, n), n, r, o, pre_);
    AddPortable<D>(g, Valid(first, n), n, r, o, pre_);
  }

  void Consume(size_t begin, size_t n, const std::byte* reduced) override {
    const auto* r = reinterpret_cast<const Storage*>(reduced);
    float* acc = spec_.grad_shard + begin;
    if (avx2_) return ConsumeAvx2<D>(r, acc, n, spec_.accumulate, stream_, post_);
    ConsumePortable<D>(r, acc, n, spec_.accumulate, post_);
  }

 private:
  // How many of the n elements from `first` lie inside the unpadded gradient.
  size_t Valid(size_t first, size_t n) const {
    return first >= spec_.grad_count ? 0 : std::min(n, spec_.grad_count - first);
  }

  GradientChunksSpec spec_;
  Pre pre_;
  Post post_;
  bool avx2_;
  bool stream_;  // write the shard around the cache (ConsumeAvx2)
};

template <typename Fn>
void WithDivisor(double factor, Fn&& fn) {
  const kernels::Divisor d = kernels::Divisor::Of(factor);
  if (d.inverse != 0.0f) {
    fn(kernels::ByExactInverse{d.inverse});
  } else {
    fn(kernels::ByDivision{d.divisor});
  }
}

template <DType D>
std::unique_ptr<ReduceScatterChunks> Make(const GradientChunksSpec& spec) {
  std::unique_ptr<ReduceScatterChunks> chunks;
  WithDivisor(spec.pre_divide, [&](auto pre) {
    WithDivisor(spec.post_divide, [&](auto post) {
      chunks = std::make_unique<GradientChunks<D, decltype(pre), decltype(post)>>(spec, pre, post);
    });
  });
  return chunks;
}

}  // namespace

std::unique_ptr<ReduceScatterChunks> MakeGradientChunks(const GradientChunksSpec& spec) {
  switch (spec.reduce_dtype) {
    case DType::kBFloat16:
      return Make<DType::kBFloat16>(spec);
    case DType::kFloat16:
      return Make<DType::kFloat16>(spec);
    default:
      return Make<DType::kFloat32>(spec);
  }
}

}  // namespace flatshard
