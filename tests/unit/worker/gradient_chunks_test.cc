// The fused gradient reduction's element loops (worker/comm/gradient_chunks.h)
// are compiled twice on x86-64, for the baseline ISA and for AVX2, and the
// AVX2 copy runs wherever the CPU has it. Both must give the same bits for
// every reduce dtype and divisor case, on what rounding treats specially:
// signed zeros, subnormals, values past fp16's range, infinities and NaNs,
// over lengths that leave vector remainders and padding. (The integration
// test gradient_reduction_test holds the copy this CPU runs against the
// separate steps between real processes.)
#include "worker/comm/gradient_chunks.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

namespace flatshard {
namespace {

using host_kernels::HostIsa;

std::vector<float> Values(size_t n, uint32_t seed) {
  const float specials[] = {0.0f,
                            -0.0f,
                            1.0e-40f,
                            -3.0e-39f,
                            7.0e4f,
                            -6.6e4f,
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::quiet_NaN(),
                            std::bit_cast<float>(0x7F800001u),  // signalling NaN, low payload
                            1.00390625f,                        // a bf16 tie
                            3.0f};
  std::vector<float> v(n);
  uint32_t x = seed;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    v[i] = (x >> 28) < 3 ? specials[(x >> 8) % std::size(specials)]
                         : (static_cast<float>(x >> 8) / 16777216.0f - 0.5f) * 8.0f;
  }
  return v;
}

bool SameBytes(const std::vector<std::byte>& a, const std::vector<std::byte>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size()) == 0;
}

TEST(GradientChunksTest, BaselineAndAvx2CopiesGiveTheSameBits) {
  if (!host_kernels::HostIsaSupported(HostIsa::kAvx2Fma)) {
    GTEST_SKIP() << "this CPU has no AVX2: only the baseline copy can run";
  }
  constexpr size_t kCount = 1037;  // per chunk: odd, past several vector widths
  constexpr size_t kWorld = 3;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (auto [pre, post] : {std::pair{2.0, 2.0}, std::pair{2.0, 3.0}, std::pair{3.0, 1.0}}) {
      for (size_t grad_count : {kCount * kWorld, kCount * kWorld - 700}) {
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(absl::StrCat(DTypeName(dtype), " pre ", pre, " post ", post, " N ",
                                    grad_count, accumulate ? " accumulate" : " first"));
          const std::vector<float> grad = Values(grad_count, 7);
          const std::vector<float> raw = Values(kCount, 11);
          const size_t es = DTypeSize(dtype);
          std::vector<std::byte> received(kCount * es);
          for (size_t i = 0; i < kCount; ++i) {
            // A received chunk in the reduce dtype: the bits of other values.
            const uint32_t bits = std::bit_cast<uint32_t>(raw[(i * 7) % kCount]);
            std::memcpy(received.data() + i * es, &bits, es);
          }
          std::vector<std::vector<std::byte>> outputs[2];
          for (int copy = 0; copy < 2; ++copy) {
            std::vector<float> shard(kCount, accumulate ? 0.25f : 0.0f);
            GradientChunksSpec spec{grad.data(), grad_count, kCount,       dtype,
                                    pre,         post,       shard.data(), accumulate};
            spec.isa = copy == 0 ? HostIsa::kPortable : HostIsa::kAvx2Fma;
            std::unique_ptr<ReduceScatterChunks> chunks = MakeGradientChunks(spec);
            auto& out = outputs[copy];
            for (size_t chunk = 0; chunk < kWorld; ++chunk) {
              // From an offset inside the chunk too, as the ring's blocks are.
              std::vector<std::byte> produced(kCount * es), added(kCount * es),
                  added_raw(kCount * es);
              chunks->Produce(chunk, 0, 5, produced.data());
              chunks->Produce(chunk, 5, kCount - 5, produced.data() + 5 * es);
              chunks->ProduceAndAdd(chunk, 0, kCount, received.data(), false, added.data());
              // A raw receive only where the ring makes one: a whole fp32 chunk.
              if (chunks->RawChunk(chunk) != nullptr) {
                chunks->ProduceAndAdd(chunk, 0, kCount,
                                      reinterpret_cast<const std::byte*>(raw.data()), true,
                                      added_raw.data());
              }
              out.push_back(produced);
              out.push_back(added);
              out.push_back(added_raw);
            }
            chunks->Consume(0, 3, received.data());
            chunks->Consume(3, kCount - 3, received.data() + 3 * es);
            std::vector<std::byte> consumed(kCount * sizeof(float));
            std::memcpy(consumed.data(), shard.data(), consumed.size());
            out.push_back(consumed);
          }
          ASSERT_EQ(outputs[0].size(), outputs[1].size());
          for (size_t k = 0; k < outputs[0].size(); ++k) {
            EXPECT_TRUE(SameBytes(outputs[0][k], outputs[1][k])) << "output " << k;
          }
        }
      }
    }
  }
}

// A shard of several MiB that the reduction writes (not accumulates) leaves
// the AVX2 copy through streaming stores, from a tile formed in L1 (kTile 256,
// kStreamShardBytes 4 MiB in gradient_chunks.cc): the same bits as the
// baseline's plain stores, from a shard that starts off a 32-byte boundary and
// blocks that end inside a tile, and nothing written outside the shard.
TEST(GradientChunksTest, AStreamedShardHoldsTheBaselinesBits) {
  if (!host_kernels::HostIsaSupported(HostIsa::kAvx2Fma)) {
    GTEST_SKIP() << "this CPU has no AVX2: only the baseline copy can run";
  }
  constexpr size_t kCount = (size_t{5} << 20) / sizeof(float) + 37;  // past the 4 MiB line
  constexpr size_t kWorld = 2;
  constexpr float kGuard = 12345.0f;
  const std::vector<float> grad = Values(kCount * kWorld, 3);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const size_t es = DTypeSize(dtype);
    const std::vector<float> raw = Values(kCount, 5);
    std::vector<std::byte> reduced(kCount * es);
    for (size_t i = 0; i < kCount; ++i) {
      const uint32_t bits = std::bit_cast<uint32_t>(raw[i]);
      std::memcpy(reduced.data() + i * es, &bits, es);
    }
    std::vector<float> shards[2];
    for (int copy = 0; copy < 2; ++copy) {
      // One float past an aligned start, so the streamed part begins after a head.
      std::vector<float>& held = shards[copy];
      held.assign(kCount + 2, kGuard);
      GradientChunksSpec spec{grad.data(), kCount * kWorld, kCount, dtype, 2.0,
                              3.0,         held.data() + 1, false};
      spec.isa = copy == 0 ? HostIsa::kPortable : HostIsa::kAvx2Fma;
      std::unique_ptr<ReduceScatterChunks> chunks = MakeGradientChunks(spec);
      for (size_t begin = 0; begin < kCount; begin += 4099) {
        const size_t n = std::min<size_t>(4099, kCount - begin);
        chunks->Consume(begin, n, reduced.data() + begin * es);
      }
    }
    EXPECT_EQ(shards[0].front(), kGuard);
    EXPECT_EQ(shards[0].back(), kGuard);
    EXPECT_EQ(shards[1].front(), kGuard);
    EXPECT_EQ(shards[1].back(), kGuard);
    EXPECT_EQ(std::memcmp(shards[0].data(), shards[1].data(), shards[0].size() * sizeof(float)), 0);
    if (dtype == DType::kFloat32) {  // and the values themselves: 0 + reduced / 3
      for (size_t i = 0; i < kCount; i += 997) {
        EXPECT_EQ(std::bit_cast<uint32_t>(shards[1][1 + i]),
                  std::bit_cast<uint32_t>(0.0f + raw[i] / 3.0f))
            << "element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace flatshard
