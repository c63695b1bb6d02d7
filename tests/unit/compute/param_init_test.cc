// Tests worker/compute/param_init.h: values are a pure function of (seed, FQN)
// so ranks agree, every overload gives the same values, slices match the
// whole, the default rules and explicit `init:` are honoured, and tied aliases
// get their primary's values.
#include "worker/compute/param_init.h"

#include <cmath>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/model_spec_yaml.h"

namespace flatshard::compute {
namespace {

using ::testing::Each;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr char kSpec[] = R"(
root:
  type: Sequential
  children:
    - {name: emb, type: Embedding, num_embeddings: 50, embedding_dim: 40}
    - {name: fc, type: Linear, in_features: 40, out_features: 64}
    - {name: ln, type: LayerNorm, normalized_shape: 64}
    - name: custom
      type: Module
      params:
        - {name: n, shape: [3000], init: {kind: normal, mean: 0.5, std: 0.02}}
        - {name: u, shape: [3000], init: {kind: uniform, low: 2, high: 3}}
        - {name: z, shape: [4, 4], init: {kind: zeros}}
        - {name: o, shape: [5], init: {kind: ones}}
    - {name: head, type: Linear, in_features: 40, out_features: 50, bias: false}
tied:
  - {alias: head.weight, primary: emb.weight}
)";

class ParamInitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto spec = ParseModelSpec(kSpec, "init.yaml");
    ASSERT_TRUE(spec.ok()) << spec.status();
    spec_ = *std::move(spec);
    auto index = IndexModel(spec_);
    ASSERT_TRUE(index.ok()) << index.status();
    index_ = *std::move(index);
  }

  std::vector<float> Values(const std::string& fqn, uint64_t seed) {
    const int p = index_.param_by_fqn.at(fqn);
    std::vector<float> v(
        static_cast<size_t>(NumElements(index_.params[static_cast<size_t>(p)].spec->shape)));
    EXPECT_TRUE(InitParam(index_, p, seed, v).ok());
    return v;
  }

  static void ExpectMoments(const std::vector<float>& v, double mean, double std, double tol) {
    double sum = 0, sum2 = 0;
    for (float x : v) sum += x;
    const double m = sum / static_cast<double>(v.size());
    for (float x : v) sum2 += (x - m) * (x - m);
    EXPECT_NEAR(m, mean, tol);
    EXPECT_NEAR(std::sqrt(sum2 / static_cast<double>(v.size())), std, tol);
  }

  ModelSpec spec_;
  ModelIndex index_;
};

TEST_F(ParamInitTest, KeyedBySeedAndFqnOnly) {
  EXPECT_EQ(Values("fc.weight", 3), Values("fc.weight", 3));
  EXPECT_NE(Values("fc.weight", 3), Values("fc.weight", 4));
  // Same shape, different FQN: different values.
  const std::vector<float> n = Values("custom.n", 3);
  const std::vector<float> u = Values("custom.u", 3);
  EXPECT_NE(n, u);
  // The ParamSpec overload, which the FSDP runtime calls, gives the same values.
  const IndexedParam& fc = index_.params[static_cast<size_t>(index_.param_by_fqn.at("fc.weight"))];
  std::vector<float> direct(40 * 64);
  ASSERT_TRUE(InitParam(*fc.spec, fc.fqn, 3, direct).ok());
  EXPECT_EQ(direct, Values("fc.weight", 3));
}

TEST_F(ParamInitTest, DefaultRules) {
  // >= 2-D: U(-1/sqrt(fan_in), 1/sqrt(fan_in)); std = bound / sqrt(3).
  const std::vector<float> w = Values("fc.weight", 1);
  const double bound = 1.0 / std::sqrt(40.0);
  for (float x : w) {
    EXPECT_GE(x, -bound);
    EXPECT_LE(x, bound);
  }
  ExpectMoments(w, 0.0, bound / std::sqrt(3.0), 0.01);
  ExpectMoments(Values("emb.weight", 1), 0.0, bound / std::sqrt(3.0), 0.01);
  EXPECT_THAT(Values("fc.bias", 1), Each(0.0f));
  EXPECT_THAT(Values("ln.weight", 1), Each(1.0f));
  EXPECT_THAT(Values("ln.bias", 1), Each(0.0f));
}

TEST_F(ParamInitTest, ExplicitInitWins) {
  ExpectMoments(Values("custom.n", 1), 0.5, 0.02, 0.002);
  const std::vector<float> u = Values("custom.u", 1);
  for (float x : u) {
    EXPECT_GE(x, 2.0f);
    EXPECT_LE(x, 3.0f);
  }
  ExpectMoments(u, 2.5, 1.0 / std::sqrt(12.0), 0.02);
  EXPECT_THAT(Values("custom.z", 1), Each(0.0f));
  EXPECT_THAT(Values("custom.o", 1), Each(1.0f));
}

TEST_F(ParamInitTest, TiedAliasGetsThePrimarysValues) {
  EXPECT_EQ(Values("head.weight", 5), Values("emb.weight", 5));
}

TEST_F(ParamInitTest, SlicesMatchTheWhole) {
  const int p = index_.param_by_fqn.at("custom.n");
  const std::vector<float> whole = Values("custom.n", 8);
  std::vector<float> pieces;
  for (int64_t begin = 0; begin < 3000; begin += 700) {
    std::vector<float> part(static_cast<size_t>(std::min<int64_t>(700, 3000 - begin)));
    ASSERT_TRUE(InitParamRange(index_, p, 8, begin, part).ok());
    pieces.insert(pieces.end(), part.begin(), part.end());
  }
  EXPECT_THAT(pieces, ElementsAreArray(whole));
}

TEST_F(ParamInitTest, SizeErrorsNameTheParameter) {
  std::vector<float> small(3);
  const absl::Status s = InitParam(index_, index_.param_by_fqn.at("fc.bias"), 1, small);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("'fc.bias' has 64 elements, the output holds 3"));
  const absl::Status r = InitParamRange(index_, index_.param_by_fqn.at("fc.bias"), 1, 62, small);
  EXPECT_THAT(std::string(r.message()),
              HasSubstr("elements [62, 65) are outside parameter 'fc.bias'"));
  EXPECT_EQ(InitParam(index_, 99, 1, small).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace flatshard::compute
