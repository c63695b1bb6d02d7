#include "worker/comm/gradient_chunks.h"

#include <algorithm>

#include "worker/device/kernels/element_ops.h"

namespace flatshard {
namespace {

using kernels::Element;

// The divisors' cases are template arguments, decided once per reduction: a
// per-element branch would keep these loops (one pass over every gradient
// each) from being straight lines.
template <DType D, typename Pre, typename Post>
class GradientChunks final : public ReduceScatterChunks {
 public:
  using Storage = typename Element<D>::Storage;

  GradientChunks(const GradientChunksSpec& spec, Pre pre, Post post)
      : spec_(spec), pre_(pre), post_(post) {}

  // A float32 chunk wholly inside the gradient goes out as the gradient's own
  // bytes; its receiver applies the pre-divide (ProduceAndAdd).
  const std::byte* RawChunk(size_t chunk) override {
    if (D != DType::kFloat32 || (chunk + 1) * spec_.count > spec_.grad_count) return nullptr;
    return reinterpret_cast<const std::byte*>(spec_.grad + chunk * spec_.count);
  }

  void Produce(size_t chunk, size_t begin, size_t n, std::byte* out) override {
    auto* o = reinterpret_cast<Storage*>(out);
    const size_t first = chunk * spec_.count + begin;
    const size_t valid = Valid(first, n);
    const float* g = spec_.grad + first;
    for (size_t i = 0; i < valid; ++i) o[i] = kernels::PrepareGradValue<D>(g[i], pre_);
    for (size_t i = valid; i < n; ++i) o[i] = Element<D>::FromFloat(0.0f);
  }

  void ProduceAndAdd(size_t chunk, size_t begin, size_t n, const std::byte* received,
                     bool received_raw, std::byte* out) override {
    auto* o = reinterpret_cast<Storage*>(out);
    const size_t first = chunk * spec_.count + begin;
    const size_t valid = Valid(first, n);
    const float* g = spec_.grad + first;
    if (received_raw) {
      // The sender's gradient as it is (RawChunk: float32, no padding).
      const auto* r = reinterpret_cast<const float*>(received);
      for (size_t i = 0; i < n; ++i) {
        o[i] =
            Add(kernels::PrepareGradValue<D>(g[i], pre_), kernels::PrepareGradValue<D>(r[i], pre_));
      }
      return;
    }
    const auto* r = reinterpret_cast<const Storage*>(received);
    for (size_t i = 0; i < valid; ++i) o[i] = Add(kernels::PrepareGradValue<D>(g[i], pre_), r[i]);
    const Storage zero = Element<D>::FromFloat(0.0f);
    for (size_t i = valid; i < n; ++i) o[i] = Add(zero, r[i]);
  }

  void Consume(size_t begin, size_t n, const std::byte* reduced) override {
    const auto* r = reinterpret_cast<const Storage*>(reduced);
    float* acc = spec_.grad_shard + begin;
    if (spec_.accumulate) {
      for (size_t i = 0; i < n; ++i) kernels::AccumulateReducedElement<D>(r, acc, post_, i);
    } else {
      for (size_t i = 0; i < n; ++i) kernels::AssignReducedElement<D>(r, acc, post_, i);
    }
  }

 private:
  // ReduceElements' SUM: in float32, 16-bit types rounded back.
  static Storage Add(Storage mine, Storage theirs) {
    return Element<D>::FromFloat(Element<D>::ToFloat(mine) + Element<D>::ToFloat(theirs));
  }
  // How many of the n elements from `first` lie inside the unpadded gradient.
  size_t Valid(size_t first, size_t n) const {
    return first >= spec_.grad_count ? 0 : std::min(n, spec_.grad_count - first);
  }

  GradientChunksSpec spec_;
  Pre pre_;
  Post post_;
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
