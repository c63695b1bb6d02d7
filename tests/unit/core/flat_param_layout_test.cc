// Tests core/flat_param_layout.h against docs/fsdp-semantics.md §1.2–1.5:
// the worked examples (A(10), B(7), W=4 in both modes), torch.chunk edge cases,
// the validation errors of §1.1/§10, and a property test over 1,000 random layouts.
#include "core/flat_param_layout.h"

#include <algorithm>
#include <random>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/model_spec.h"

namespace flatshard {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

FlatParamLayout MakeAB(bool use_orig_params, int world_size = 4) {
  FlatParamLayoutOptions options;
  options.world_size = world_size;
  options.use_orig_params = use_orig_params;
  auto layout = FlatParamLayout::Create(
      {{"A", {10}, DType::kFloat32, true}, {"B", {7}, DType::kFloat32, true}}, options, "unit 0");
  EXPECT_TRUE(layout.ok()) << layout.status();
  return *std::move(layout);
}

void ExpectInfo(const ShardParamInfo& info, bool in_shard, int64_t offset, int64_t numel,
                int64_t intra_start, int64_t intra_end) {
  EXPECT_EQ(info.in_shard, in_shard);
  if (!in_shard) return;
  EXPECT_EQ(info.offset_in_shard, offset);
  EXPECT_EQ(info.numel_in_shard, numel);
  EXPECT_EQ(info.intra_param_start_idx, intra_start);
  EXPECT_EQ(info.intra_param_end_idx, intra_end);
}

// docs/fsdp-semantics.md §1.2 worked example, use_orig_params=True.
TEST(FlatParamLayoutTest, WorkedExampleUseOrigParams) {
  FlatParamLayout layout = MakeAB(/*use_orig_params=*/true);
  EXPECT_EQ(layout.aligned_numel(), 4);
  EXPECT_THAT(layout.numels_with_padding(), ElementsAre(10, 2, 7, 1));
  EXPECT_THAT(layout.is_padding_mask(), ElementsAre(false, true, false, true));
  EXPECT_EQ(layout.unpadded_unsharded_numel(), 20);
  ASSERT_EQ(layout.param_ranges().size(), 2u);
  EXPECT_EQ(layout.param_ranges()[0].start, 0);
  EXPECT_EQ(layout.param_ranges()[0].end, 9);
  EXPECT_EQ(layout.param_ranges()[1].start, 12);
  EXPECT_EQ(layout.param_ranges()[1].end, 18);
  // The world-size padding makes N divisible by W, so _get_shard pads nothing.
  EXPECT_EQ(layout.sharded_numel(), 5);
  EXPECT_EQ(layout.padded_unsharded_numel(), 20);
  for (int r = 0; r < 4; ++r) EXPECT_EQ(layout.ComputeShardInfo(r).numel_padded, 0);

  const ShardInfo r2 = layout.ComputeShardInfo(2);  // [10, 14]
  ExpectInfo(r2.params[0], false, 0, 0, 0, 0);
  ExpectInfo(r2.params[1], true, /*offset=*/2, /*numel=*/3, 0, 2);
  const ShardInfo r3 = layout.ComputeShardInfo(3);  // [15, 19]
  ExpectInfo(r3.params[1], true, 0, 4, 3, 6);
}

// docs/fsdp-semantics.md §1.2 and §1.4 worked examples, use_orig_params=False.
TEST(FlatParamLayoutTest, WorkedExampleWithoutOrigParams) {
  FlatParamLayout layout = MakeAB(/*use_orig_params=*/false);
  EXPECT_EQ(layout.aligned_numel(), 0);
  EXPECT_THAT(layout.numels_with_padding(), ElementsAre(10, 7));
  EXPECT_THAT(layout.is_padding_mask(), ElementsAre(false, false));
  EXPECT_EQ(layout.unpadded_unsharded_numel(), 17);
  EXPECT_EQ(layout.param_ranges()[1].start, 10);
  EXPECT_EQ(layout.param_ranges()[1].end, 16);
  EXPECT_EQ(layout.sharded_numel(), 5);
  EXPECT_EQ(layout.padded_unsharded_numel(), 20);

  const ShardInfo r0 = layout.ComputeShardInfo(0);
  EXPECT_EQ(r0.range.start, 0);
  EXPECT_EQ(r0.range.end, 4);
  ExpectInfo(r0.params[0], true, 0, 5, 0, 4);
  ExpectInfo(r0.params[1], false, 0, 0, 0, 0);

  const ShardInfo r1 = layout.ComputeShardInfo(1);
  EXPECT_EQ(r1.range.start, 5);
  EXPECT_EQ(r1.range.end, 9);
  ExpectInfo(r1.params[0], true, 0, 5, 5, 9);
  ExpectInfo(r1.params[1], false, 0, 0, 0, 0);
  EXPECT_EQ(r1.numel_padded, 0);

  const ShardInfo r2 = layout.ComputeShardInfo(2);
  EXPECT_EQ(r2.range.start, 10);
  EXPECT_EQ(r2.range.end, 14);
  ExpectInfo(r2.params[0], false, 0, 0, 0, 0);
  ExpectInfo(r2.params[1], true, 0, 5, 0, 4);
  EXPECT_EQ(r2.numel_padded, 0);

  const ShardInfo r3 = layout.ComputeShardInfo(3);
  EXPECT_EQ(r3.range.start, 15);
  EXPECT_EQ(r3.range.end, 19);
  ExpectInfo(r3.params[1], true, 0, 2, 5, 6);
  EXPECT_EQ(r3.numel_padded, 3);
}

// docs/fsdp-semantics.md §1.5: only in-shard params, offsets are intra-param [start, end].
TEST(FlatParamLayoutTest, ShardMetadataListsInShardParamsOnly) {
  FlatParamLayout layout = MakeAB(false);
  FlatParamShardMetadata m3 = layout.ComputeShardMetadata(3);
  EXPECT_THAT(m3.param_names, ElementsAre("B"));
  EXPECT_THAT(m3.param_numels, ElementsAre(7));
  ASSERT_EQ(m3.param_offsets.size(), 1u);
  EXPECT_EQ(m3.param_offsets[0].start, 5);
  EXPECT_EQ(m3.param_offsets[0].end, 6);
  EXPECT_THAT(m3.param_contiguities, ElementsAre(true));
  EXPECT_THAT(m3.param_strides[0], ElementsAre(1));
  FlatParamShardMetadata m0 = layout.ComputeShardMetadata(0);
  EXPECT_THAT(m0.param_names, ElementsAre("A"));
}

// docs/fsdp-semantics.md §1.3: torch.chunk leaves trailing ranks empty (N=5, W=4: S=2).
TEST(FlatParamLayoutTest, ChunkSemanticsMatchTorchChunk) {
  EXPECT_EQ(ChunkSize(5, 4), 2);
  EXPECT_EQ(ChunkOf(5, 4, 0).length, 2);
  EXPECT_EQ(ChunkOf(5, 4, 2).length, 1);
  EXPECT_EQ(ChunkOf(5, 4, 2).padding, 1);
  EXPECT_EQ(ChunkOf(5, 4, 3).length, 0);
  EXPECT_EQ(ChunkOf(5, 4, 3).padding, 2);
  EXPECT_EQ(ChunkSize(0, 4), 0);
  EXPECT_EQ(ChunkOf(7, 1, 0).length, 7);
}

// docs/fsdp-semantics.md §1.2: alignment is 16 bytes of the low-precision compute dtype.
TEST(FlatParamLayoutTest, AlignmentFollowsComputeDtype) {
  FlatParamLayoutOptions options;
  options.world_size = 3;
  options.use_orig_params = true;
  options.has_compute_dtype = true;
  options.compute_dtype = DType::kBFloat16;
  auto layout = FlatParamLayout::Create(
      {{"a", {3}, DType::kFloat32, true}, {"b", {5}, DType::kFloat32, true}}, options, "u");
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->aligned_numel(), 8);
  // a(3) pad(5) b(5) = 13, world-size pad 2 -> 15.
  EXPECT_THAT(layout->numels_with_padding(), ElementsAre(3, 5, 5, 2));
  EXPECT_EQ(layout->unpadded_unsharded_numel(), 15);
  options.compute_dtype = DType::kFloat64;
  layout = FlatParamLayout::Create({{"a", {3}, DType::kFloat32, true}}, options, "u");
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->aligned_numel(), 2);
}

TEST(FlatParamLayoutTest, NoShardKeepsTheWholeFlatParameter) {
  FlatParamLayoutOptions options;
  options.world_size = 4;
  options.sharded = false;
  auto layout = FlatParamLayout::Create({{"A", {10}, DType::kFloat32, true}}, options, "u");
  ASSERT_TRUE(layout.ok());
  EXPECT_EQ(layout->sharded_numel(), 10);
  const ShardInfo info = layout->ComputeShardInfo(2);
  EXPECT_EQ(info.range.start, 0);
  EXPECT_EQ(info.range.end, 9);
  EXPECT_EQ(info.numel_padded, 0);
  ExpectInfo(info.params[0], true, 0, 10, 0, 9);
}

// docs/fsdp-semantics.md §1.1 and §10: _validate_tensors_to_flatten.
TEST(FlatParamLayoutTest, RejectsWhatFsdpRejects) {
  FlatParamLayoutOptions options;
  options.world_size = 2;
  auto empty = FlatParamLayout::Create({}, options, "unit 4 (layers.3)");
  EXPECT_THAT(std::string(empty.status().message()),
              HasSubstr("unit 4 (layers.3): Cannot construct a FlatParamHandle with an empty"));

  auto integer = FlatParamLayout::Create({{"w", {4}, DType::kInt32, false}}, options, "unit 3");
  EXPECT_THAT(std::string(integer.status().message()),
              HasSubstr("parameter 'w' has dtype int32; only floating dtypes can be sharded"));

  auto mixed = FlatParamLayout::Create(
      {{"w", {4}, DType::kFloat32, true}, {"h", {4}, DType::kFloat16, true}}, options, "u");
  EXPECT_THAT(std::string(mixed.status().message()), HasSubstr("must share one dtype"));

  auto frozen = FlatParamLayout::Create(
      {{"w", {4}, DType::kFloat32, true}, {"f", {4}, DType::kFloat32, false}}, options, "u");
  EXPECT_THAT(std::string(frozen.status().message()), HasSubstr("only with use_orig_params"));
  options.use_orig_params = true;
  EXPECT_TRUE(
      FlatParamLayout::Create(
          {{"w", {4}, DType::kFloat32, true}, {"f", {4}, DType::kFloat32, false}}, options, "u")
          .ok());

  options.world_size = 0;
  EXPECT_FALSE(FlatParamLayout::Create({{"w", {4}, DType::kFloat32, true}}, options, "u").ok());
}

// Property test over 1,000 random layouts (world sizes 1-64, random shapes and
// dtypes, both modes): the shards tile [0, S*W) exactly, and every original
// element sits in exactly one rank's shard at the offset the metadata gives.
TEST(FlatParamLayoutPropertyTest, ShardsTileAndLocateEveryElement) {
  std::mt19937_64 rng(20261122);
  const DType kDtypes[] = {DType::kFloat32, DType::kFloat64, DType::kFloat16, DType::kBFloat16};
  for (int trial = 0; trial < 1000; ++trial) {
    const int world = std::uniform_int_distribution<int>(1, 64)(rng);
    const DType dtype = kDtypes[rng() % 4];
    FlatParamLayoutOptions options;
    options.world_size = world;
    options.use_orig_params = rng() % 2 == 0;
    options.has_compute_dtype = rng() % 3 == 0;
    options.compute_dtype = kDtypes[rng() % 4];
    std::vector<FlatParamEntry> params;
    const int count = std::uniform_int_distribution<int>(1, 8)(rng);
    for (int i = 0; i < count; ++i) {
      std::vector<int64_t> shape(std::uniform_int_distribution<size_t>(0, 3)(rng));
      for (int64_t& d : shape) d = std::uniform_int_distribution<int64_t>(1, 37)(rng);
      params.push_back({"p" + std::to_string(i), shape, dtype, true});
    }
    SCOPED_TRACE(testing::Message()
                 << "trial " << trial << " W=" << world << " orig=" << options.use_orig_params);
    auto created = FlatParamLayout::Create(params, options, "u");
    ASSERT_TRUE(created.ok()) << created.status();
    const FlatParamLayout& layout = *created;
    const int64_t n = layout.unpadded_unsharded_numel();
    const int64_t s = layout.sharded_numel();

    // Mode invariants (docs/fsdp-semantics.md §1.2).
    int64_t sum = 0;
    for (int64_t x : layout.numels_with_padding()) sum += x;
    ASSERT_EQ(sum, n);
    if (options.use_orig_params) {
      ASSERT_EQ(n % world, 0);
      for (const FlatRange& r : layout.param_ranges()) {
        ASSERT_EQ(r.start % layout.aligned_numel(), 0);
      }
    } else {
      ASSERT_EQ(n, layout.param_numel());
    }
    ASSERT_EQ(s, (n + world - 1) / world);
    ASSERT_GE(s * world, n);
    ASSERT_LT(s * world - n, world);

    // The shards tile [0, S*W): contiguous, S long, padding only past N.
    int64_t real_total = 0;
    std::vector<ShardInfo> infos;
    for (int r = 0; r < world; ++r) {
      infos.push_back(layout.ComputeShardInfo(r));
      const ShardInfo& info = infos.back();
      ASSERT_EQ(info.range.start, r * s);
      ASSERT_EQ(info.range.numel(), s);
      ASSERT_EQ(info.numel_padded, s - std::clamp<int64_t>(n - r * s, 0, s));
      real_total += s - info.numel_padded;
    }
    ASSERT_EQ(real_total, n);

    // Each param's elements are covered once, in order, at consistent offsets.
    for (size_t i = 0; i < params.size(); ++i) {
      const FlatRange& pr = layout.param_ranges()[i];
      int64_t next = 0;
      for (int r = 0; r < world; ++r) {
        const ShardParamInfo& p = infos[static_cast<size_t>(r)].params[i];
        if (!p.in_shard) continue;
        ASSERT_EQ(p.intra_param_start_idx, next) << "param " << i << " rank " << r;
        ASSERT_GE(p.offset_in_shard, 0);
        ASSERT_LT(p.offset_in_shard, s);
        ASSERT_LE(p.offset_in_shard + p.numel_in_shard, s);
        // Flat position of the slice's first element agrees both ways.
        ASSERT_EQ(r * s + p.offset_in_shard, pr.start + p.intra_param_start_idx);
        next = p.intra_param_end_idx + 1;
      }
      ASSERT_EQ(next, pr.numel()) << "param " << i << " not fully covered";
    }
  }
}

}  // namespace
}  // namespace flatshard
