// Tests core/flat_buffer.h: flatten_tensors with 42-valued padding (docs/fsdp-semantics.md
// §1.2), _get_shard's zero right-padding (§1.3), and the round trip
// flatten -> shard -> gather -> unflatten over 1,000 random layouts.
#include "core/flat_buffer.h"

#include <cstring>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/model_spec.h"

namespace flatshard {
namespace {

using ::testing::HasSubstr;

std::vector<std::byte> RandomBytes(size_t n, std::mt19937_64& rng) {
  std::vector<std::byte> bytes(n);
  for (std::byte& b : bytes) b = static_cast<std::byte>(rng() & 0xFF);
  return bytes;
}

TEST(FlatBufferTest, PaddingIsFortyTwoInsideAndZeroAtTheShardEnd) {
  FlatParamLayoutOptions options;
  options.world_size = 4;
  options.use_orig_params = true;
  auto layout = FlatParamLayout::Create(
      {{"A", {10}, DType::kFloat32, true}, {"B", {7}, DType::kFloat32, true}}, options, "u");
  ASSERT_TRUE(layout.ok());
  std::vector<float> a(10, 1.0f), b(7, 2.0f), flat(20, 0.0f);
  ASSERT_TRUE(FlattenParams(*layout, DType::kFloat32,
                            {std::as_bytes(std::span(a)), std::as_bytes(std::span(b))},
                            std::as_writable_bytes(std::span(flat)))
                  .ok());
  EXPECT_EQ(flat[9], 1.0f);
  EXPECT_EQ(flat[10], 42.0f);  // alignment padding
  EXPECT_EQ(flat[11], 42.0f);
  EXPECT_EQ(flat[12], 2.0f);
  EXPECT_EQ(flat[19], 42.0f);  // world-size padding

  // Without use_orig_params: N=17, S=5, rank 3's shard is B[5..6] + 3 zeros.
  options.use_orig_params = false;
  layout = FlatParamLayout::Create(
      {{"A", {10}, DType::kFloat32, true}, {"B", {7}, DType::kFloat32, true}}, options, "u");
  ASSERT_TRUE(layout.ok());
  std::vector<float> flat17(17);
  ASSERT_TRUE(FlattenParams(*layout, DType::kFloat32,
                            {std::as_bytes(std::span(a)), std::as_bytes(std::span(b))},
                            std::as_writable_bytes(std::span(flat17)))
                  .ok());
  std::vector<float> shard(5, -1.0f);
  ASSERT_TRUE(CopyShard(*layout, DType::kFloat32, 3, std::as_bytes(std::span(flat17)),
                        std::as_writable_bytes(std::span(shard)))
                  .ok());
  EXPECT_EQ(shard, (std::vector<float>{2.0f, 2.0f, 0.0f, 0.0f, 0.0f}));
}

TEST(FlatBufferTest, SizeMismatchesAreErrorsNotOverruns) {
  FlatParamLayoutOptions options;
  options.world_size = 2;
  auto layout = FlatParamLayout::Create({{"w", {2, 3}, DType::kFloat32, true}}, options, "u");
  ASSERT_TRUE(layout.ok());
  std::vector<float> small(5), flat(6), shard(3);
  absl::Status s = FlattenParams(*layout, DType::kFloat32, {std::as_bytes(std::span(small))},
                                 std::as_writable_bytes(std::span(flat)));
  EXPECT_THAT(std::string(s.message()), HasSubstr("parameter 'w' has 20 bytes, expected 24"));
  s = CopyShard(*layout, DType::kFloat32, 2, std::as_bytes(std::span(flat)),
                std::as_writable_bytes(std::span(shard)));
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 2 is outside [0, 2)"));
  s = CopyShard(*layout, DType::kFloat32, 0, std::as_bytes(std::span(flat)),
                std::as_writable_bytes(std::span(small)));
  EXPECT_THAT(std::string(s.message()), HasSubstr("shard has 20 bytes"));
  s = FlattenParams(*layout, DType::kFloat32, {}, std::as_writable_bytes(std::span(flat)));
  EXPECT_THAT(std::string(s.message()), HasSubstr("got 0 parameters"));
}

// flatten -> shard -> gather -> unflatten is the identity (1,000 random layouts).
TEST(FlatBufferPropertyTest, FlattenShardGatherUnflattenIsIdentity) {
  std::mt19937_64 rng(7);
  const DType kDtypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  for (int trial = 0; trial < 1000; ++trial) {
    const int world = std::uniform_int_distribution<int>(1, 64)(rng);
    const DType dtype = kDtypes[rng() % 4];
    const size_t es = DTypeSize(dtype);
    FlatParamLayoutOptions options;
    options.world_size = world;
    options.use_orig_params = rng() % 2 == 0;
    options.sharded = rng() % 8 != 0;
    std::vector<FlatParamEntry> entries;
    std::vector<std::vector<std::byte>> data;
    const int count = std::uniform_int_distribution<int>(1, 6)(rng);
    for (int i = 0; i < count; ++i) {
      std::vector<int64_t> shape(std::uniform_int_distribution<size_t>(0, 3)(rng));
      for (int64_t& d : shape) d = std::uniform_int_distribution<int64_t>(1, 19)(rng);
      entries.push_back({"p" + std::to_string(i), shape, dtype, true});
      data.push_back(RandomBytes(static_cast<size_t>(NumElements(shape)) * es, rng));
    }
    SCOPED_TRACE(testing::Message() << "trial " << trial << " W=" << world);
    auto layout = FlatParamLayout::Create(entries, options, "u");
    ASSERT_TRUE(layout.ok()) << layout.status();

    std::vector<std::byte> flat(static_cast<size_t>(layout->unpadded_unsharded_numel()) * es);
    std::vector<std::span<const std::byte>> inputs(data.begin(), data.end());
    ASSERT_TRUE(FlattenParams(*layout, dtype, inputs, flat).ok());

    const int shards = options.sharded ? world : 1;
    std::vector<std::vector<std::byte>> shard_data;
    for (int r = 0; r < shards; ++r) {
      shard_data.emplace_back(static_cast<size_t>(layout->sharded_numel()) * es);
      ASSERT_TRUE(CopyShard(*layout, dtype, r, flat, shard_data.back()).ok());
      // Right padding is zero (docs/fsdp-semantics.md §1.3).
      const ShardInfo info = layout->ComputeShardInfo(r);
      const size_t real = static_cast<size_t>(layout->sharded_numel() - info.numel_padded) * es;
      for (size_t b = real; b < shard_data.back().size(); ++b) {
        ASSERT_EQ(shard_data.back()[b], std::byte{0});
      }
    }
    std::vector<std::byte> gathered(static_cast<size_t>(layout->padded_unsharded_numel()) * es);
    std::vector<std::span<const std::byte>> shard_spans(shard_data.begin(), shard_data.end());
    ASSERT_TRUE(AssembleUnsharded(*layout, dtype, shard_spans, gathered).ok());
    ASSERT_EQ(std::memcmp(gathered.data(), flat.data(), flat.size()), 0);

    std::vector<std::vector<std::byte>> out;
    out.reserve(data.size());
    for (const auto& d : data) out.emplace_back(d.size());
    std::vector<std::span<std::byte>> outputs(out.begin(), out.end());
    ASSERT_TRUE(UnflattenParams(*layout, dtype, gathered, outputs).ok());
    for (size_t i = 0; i < data.size(); ++i) ASSERT_EQ(out[i], data[i]) << "param " << i;
  }
}

}  // namespace
}  // namespace flatshard
