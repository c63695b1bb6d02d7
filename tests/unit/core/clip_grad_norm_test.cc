// Tests core/clip_grad_norm.h (docs/fsdp-semantics.md §8): option checks, the local
// contributions against norms computed independently in double, the sharded
// property (W shards with zero padding, their contributions SUM- or
// MAX-reduced, give the unsharded norm for p = 1, 2, 3, inf), the non-sharded
// contribution joining after the reduce, and the clip coefficient and scaling,
// with coefficients printed by torch 2.15.0 for the float32 arithmetic.
#include "core/clip_grad_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace flatshard {
namespace {

using ::testing::HasSubstr;

constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kRel = 1e-6;

std::vector<float> RandomGrads(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

// The independent reference: the p-norm of all elements, in double.
double ReferenceNorm(const std::vector<float>& g, double p) {
  if (std::isinf(p)) {
    double m = 0.0;
    for (const float x : g) m = std::max(m, std::fabs(static_cast<double>(x)));
    return m;
  }
  double s = 0.0;
  for (const float x : g) s += std::pow(std::fabs(static_cast<double>(x)), p);
  return std::pow(s, 1.0 / p);
}

// FSDP's _get_shard: W chunks of ceil(N / W), the tail zero-padded.
std::vector<std::vector<float>> Shard(const std::vector<float>& flat, size_t world) {
  const size_t chunk = (flat.size() + world - 1) / world;
  std::vector<std::vector<float>> shards(world, std::vector<float>(chunk, 0.0f));
  for (size_t i = 0; i < flat.size(); ++i) shards[i / chunk][i % chunk] = flat[i];
  return shards;
}

double Contribution(const std::vector<float>& grads, double p) {
  return IsInfNorm(p) ? LocalGradNormInf(grads) : LocalGradNormPow(grads, p);
}

TEST(ClipGradNormOptionsTest, ChecksNameTheField) {
  EXPECT_TRUE(ValidateClipGradNormOptions({.max_norm = 1.0}).ok());
  EXPECT_TRUE(ValidateClipGradNormOptions({.max_norm = 0.0, .norm_type = kInf}).ok());
  EXPECT_TRUE(ValidateClipGradNormOptions({.max_norm = 1.0, .norm_type = 0.5}).ok());
  EXPECT_EQ(std::string(ValidateClipGradNormOptions({.max_norm = -1.0}).message()),
            "clip_grad_norm.max_norm must be >= 0, got -1");
  EXPECT_THAT(std::string(ValidateClipGradNormOptions({.max_norm = NAN}).message()),
              HasSubstr("clip_grad_norm.max_norm"));
  for (const double bad : {0.0, -2.0, -kInf, static_cast<double>(NAN)}) {
    const absl::Status status = ValidateClipGradNormOptions({.max_norm = 1.0, .norm_type = bad});
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_THAT(std::string(status.message()),
                HasSubstr("clip_grad_norm.norm_type must be > 0 or inf"));
  }
  EXPECT_TRUE(std::isnan(LocalGradNormPow(std::vector<float>{1.0f}, 0.0)));
  EXPECT_TRUE(std::isnan(TotalNormFromReduced(1.0, 0.0, -1.0)));
}

// docs/fsdp-semantics.md §8 step 5: SUM for finite p, MAX for inf.
TEST(ClipGradNormTest, ReduceOpFollowsTheNormType) {
  EXPECT_EQ(NormReduceOpFor(2.0), NormReduceOp::kSum);
  EXPECT_EQ(NormReduceOpFor(1.0), NormReduceOp::kSum);
  EXPECT_EQ(NormReduceOpFor(kInf), NormReduceOp::kMax);
  EXPECT_TRUE(IsInfNorm(kInf));
  EXPECT_FALSE(IsInfNorm(1e300));
}

TEST(ClipGradNormTest, LocalContributionIsTheSumOfPowers) {
  const std::vector<float> g = RandomGrads(4099, 3);
  for (const double p : {1.0, 2.0, 3.0, 0.5, 4.5}) {
    const double want = std::pow(ReferenceNorm(g, p), p);
    EXPECT_NEAR(LocalGradNormPow(g, p), want, kRel * want) << "p=" << p;
  }
  EXPECT_EQ(LocalGradNormInf(g), ReferenceNorm(g, kInf));  // max is exact
  EXPECT_EQ(LocalGradNormPow(std::vector<float>{3.0f, -4.0f}, 2.0), 25.0);
  EXPECT_EQ(LocalGradNormPow(std::vector<float>{3.0f, -4.0f}, 1.0), 7.0);
  // No grads: torch's zero scalar.
  EXPECT_EQ(LocalGradNormPow(std::span<const float>(), 2.0), 0.0);
  EXPECT_EQ(LocalGradNormInf(std::span<const float>()), 0.0);
}

// torch's norm of per-tensor norms is the norm of all elements together.
TEST(ClipGradNormTest, SeveralTensorsCombineAsOneVector) {
  const std::vector<float> a = RandomGrads(1000, 4), b = RandomGrads(37, 5, 10.0f),
                           c = RandomGrads(513, 6, 1e-3f);
  std::vector<float> all = a;
  all.insert(all.end(), b.begin(), b.end());
  all.insert(all.end(), c.begin(), c.end());
  const std::vector<std::span<const float>> tensors = {a, b, c};
  for (const double p : {1.0, 2.0, 3.0}) {
    const double want = std::pow(ReferenceNorm(all, p), p);
    EXPECT_NEAR(LocalGradNormPow(tensors, p), want, kRel * want) << "p=" << p;
    EXPECT_EQ(LocalGradNormContribution(tensors, p), LocalGradNormPow(tensors, p));
  }
  EXPECT_EQ(LocalGradNormInf(tensors), ReferenceNorm(all, kInf));
  EXPECT_EQ(LocalGradNormContribution(tensors, kInf), ReferenceNorm(all, kInf));
}

TEST(ClipGradNormTest, NaNAndOverflowBehaveAsTorchsFloat32) {
  std::vector<float> g = {1.0f, NAN, -3.0f};
  EXPECT_TRUE(std::isnan(LocalGradNormInf(g)));
  EXPECT_TRUE(std::isnan(LocalGradNormPow(g, 2.0)));
  // torch's float32 `norm ** 2` overflows once the norm passes ~1.8e19.
  const std::vector<float> big = {3e19f, 1.0f};
  EXPECT_TRUE(std::isinf(LocalGradNormPow(big, 2.0)));
  EXPECT_EQ(LocalGradNormPow(big, 1.0), static_cast<double>(3e19f));
  EXPECT_TRUE(std::isnan(TotalNormFromReduced(NAN, 0.0, kInf)));
  EXPECT_TRUE(std::isnan(TotalNormFromReduced(1.0, NAN, kInf)));
}

// The sharded property of docs/fsdp-semantics.md §8: each of W ranks computes its padded
// shard's contribution, the sum (or max) stands in for the all-reduce, and the
// total equals the unsharded norm. Scaling the shards with the resulting
// coefficient equals scaling the whole gradient.
TEST(ClipGradNormTest, ShardedContributionsReduceToTheUnshardedNorm) {
  const std::vector<float> flat = RandomGrads(1009, 7);  // prime: no W divides it
  for (const double p : {1.0, 2.0, 3.0, kInf}) {
    const double want = ReferenceNorm(flat, p);
    const double unsharded = TotalNormFromReduced(Contribution(flat, p), 0.0, p);
    EXPECT_NEAR(unsharded, want, kRel * want) << "p=" << p;
    for (size_t world = 1; world <= 8; ++world) {
      const std::vector<std::vector<float>> shards = Shard(flat, world);
      double reduced = 0.0;
      for (const std::vector<float>& shard : shards) {
        const double local = Contribution(shard, p);
        reduced =
            NormReduceOpFor(p) == NormReduceOp::kMax ? std::max(reduced, local) : reduced + local;
      }
      const double total = TotalNormFromReduced(reduced, 0.0, p);
      EXPECT_NEAR(total, want, kRel * want) << "p=" << p << " W=" << world;
      EXPECT_NEAR(total, unsharded, kRel * want) << "p=" << p << " W=" << world;

      const double max_norm = 0.25 * want;
      const double coef = ClipCoefficient(max_norm, total);
      EXPECT_NEAR(coef, max_norm / (want + 1e-6), 2 * kRel * coef);
      std::vector<float> whole = flat;
      ScaleGrads(whole, coef);
      std::vector<float> gathered;
      for (std::vector<float> shard : shards) {
        ScaleGrads(shard, coef);
        gathered.insert(gathered.end(), shard.begin(), shard.end());
      }
      gathered.resize(flat.size());  // drop the padding, which stays zero
      EXPECT_EQ(gathered, whole) << "p=" << p << " W=" << world;
      // After clipping, the norm is max_norm.
      EXPECT_NEAR(ReferenceNorm(whole, p), max_norm, 1e-5 * max_norm) << "p=" << p;
    }
  }
}

// docs/fsdp-semantics.md §8 step 5: replicated (non-sharded) grads are added after the
// all-reduce, once, not W times.
TEST(ClipGradNormTest, NonShardedContributionJoinsAfterTheReduce) {
  const std::vector<float> sharded = RandomGrads(300, 8), replicated = RandomGrads(45, 9, 3.0f);
  std::vector<float> all = sharded;
  all.insert(all.end(), replicated.begin(), replicated.end());
  for (const double p : {1.0, 2.0, 3.0, kInf}) {
    double reduced = 0.0;
    for (const std::vector<float>& shard : Shard(sharded, 4)) {
      const double local = Contribution(shard, p);
      reduced = IsInfNorm(p) ? std::max(reduced, local) : reduced + local;
    }
    const double total = TotalNormFromReduced(reduced, Contribution(replicated, p), p);
    const double want = ReferenceNorm(all, p);
    EXPECT_NEAR(total, want, kRel * want) << "p=" << p;
  }
}

// torch.clamp(max_norm / (torch.tensor(total, dtype=float32) + 1e-6), max=1.0),
// printed by torch 2.15.0: the float32 reciprocal-then-multiply, not the double
// quotient (e.g. 1/123456.789 rounds to 8.09999983e-06, not 8.10000007e-06).
TEST(ClipGradNormTest, ClipCoefficientIsTorchsFloat32Value) {
  EXPECT_EQ(ClipCoefficient(1.0, 3.0), static_cast<double>(0.333333224f));
  EXPECT_EQ(ClipCoefficient(0.5, 0.123456789), 1.0);
  EXPECT_EQ(ClipCoefficient(1.0, 0.9999995), static_cast<double>(0.999999523f));
  EXPECT_EQ(ClipCoefficient(2.5, 1e-7), 1.0);
  EXPECT_EQ(ClipCoefficient(1.0, 123456.789), static_cast<double>(8.09999983e-06f));
  EXPECT_EQ(ClipCoefficient(0.1, 7.0), static_cast<double>(0.0142857125f));
  EXPECT_EQ(ClipCoefficient(1.0, 0.0), 1.0);  // no grads: clamped, grads untouched
  EXPECT_EQ(ClipCoefficient(1.0, kInf), 0.0);
  EXPECT_TRUE(std::isnan(ClipCoefficient(1.0, NAN)));  // torch.clamp keeps NaN
}

TEST(ClipGradNormTest, ScaleGradsMultipliesByTheFloat32Coefficient) {
  std::vector<float> g = {1.0f, -2.0f, 0.1f};
  const double coef = 0.1;  // not a float32 value: rounded first, as coef.to(float32)
  ScaleGrads(g, coef);
  EXPECT_EQ(g, (std::vector<float>{0.1f, -2.0f * 0.1f, 0.1f * 0.1f}));
  ScaleGrads(g, 1.0);
  EXPECT_EQ(g, (std::vector<float>{0.1f, -2.0f * 0.1f, 0.1f * 0.1f}));
}

}  // namespace
}  // namespace flatshard
