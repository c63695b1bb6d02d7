// Tests worker/compute's backward passes: for every layer, both losses and
// whole small MLP and GPT models, the grads Model::Backward accumulates match
// fourth-order central finite differences of Model::ForwardLoss, element by
// element.
#include <gtest/gtest.h>

#include "tests/unit/compute/compute_test_util.h"

namespace flatshard::compute {
namespace {

using testutil::BuildTestModel;
using testutil::ExpectGradientsMatchFiniteDifferences;
using testutil::RandomDenseBatch;
using testutil::RandomTokenBatch;

struct DenseCase {
  const char* name;
  const char* yaml;
  LossKind loss;
  int64_t in;
  int64_t out;  // output width (classes for cross-entropy)
  // ReLU is not differentiable at 0: a smaller step makes it unlikely that a
  // difference straddles a kink, at the price of more float32 noise. Whether
  // one does depends on the seeds (with seed 7, a pre-activation sits at 1e-6).
  double eps = testutil::GradCheckOptions().eps;
};

void PrintTo(const DenseCase& c, std::ostream* os) { *os << c.name; }

class DenseGradientTest : public ::testing::TestWithParam<DenseCase> {};

TEST_P(DenseGradientTest, MatchesFiniteDifferences) {
  const DenseCase& c = GetParam();
  auto tm = BuildTestModel(c.yaml, c.loss, /*seed=*/9);
  ASSERT_TRUE(tm.ok()) << tm.status();
  const Batch batch = RandomDenseBatch(5, c.in, c.out, c.loss, /*seed=*/11);
  testutil::GradCheckOptions options;
  if (c.eps != options.eps) {
    options.eps = c.eps;
    options.atol = 2e-4;
  }
  EXPECT_GT(ExpectGradientsMatchFiniteDifferences(*tm, batch, options), 0);
}

INSTANTIATE_TEST_SUITE_P(
    Layers, DenseGradientTest,
    ::testing::Values(
        DenseCase{"linear_mse",
                  "root: {type: Sequential, children: ["
                  "{name: fc, type: Linear, in_features: 3, out_features: 4}]}",
                  LossKind::kMse, 3, 4},
        DenseCase{"linear_no_bias_cross_entropy",
                  "root: {type: Sequential, children: ["
                  "{name: fc, type: Linear, in_features: 3, out_features: 4, bias: false}]}",
                  LossKind::kCrossEntropy, 3, 4},
        DenseCase{"relu",
                  "root: {type: Sequential, children: ["
                  "{name: a, type: Linear, in_features: 3, out_features: 6},"
                  "{name: act, type: ReLU},"
                  "{name: b, type: Linear, in_features: 6, out_features: 2}]}",
                  LossKind::kMse, 3, 2, 1e-3},
        DenseCase{"gelu_erf",
                  "root: {type: Sequential, children: ["
                  "{name: a, type: Linear, in_features: 3, out_features: 6},"
                  "{name: act, type: GELU},"
                  "{name: b, type: Linear, in_features: 6, out_features: 2}]}",
                  LossKind::kMse, 3, 2},
        DenseCase{"gelu_tanh",
                  "root: {type: Sequential, children: ["
                  "{name: a, type: Linear, in_features: 3, out_features: 6},"
                  "{name: act, type: GELU, attrs: {approximate: tanh}},"
                  "{name: b, type: Linear, in_features: 6, out_features: 2}]}",
                  LossKind::kMse, 3, 2},
        DenseCase{"layer_norm",
                  "root: {type: Sequential, children: ["
                  "{name: a, type: Linear, in_features: 3, out_features: 6},"
                  "{name: ln, type: LayerNorm, normalized_shape: 6, attrs: {eps: '1e-3'}},"
                  "{name: b, type: Linear, in_features: 6, out_features: 3}]}",
                  LossKind::kCrossEntropy, 3, 3},
        DenseCase{"layer_norm_without_affine",
                  "root: {type: Sequential, children: ["
                  "{name: a, type: Linear, in_features: 3, out_features: 6},"
                  "{name: ln, type: LayerNorm, normalized_shape: 6, elementwise_affine: false},"
                  "{name: b, type: Linear, in_features: 6, out_features: 2}]}",
                  LossKind::kMse, 3, 2},
        DenseCase{"layer_norm_without_bias",
                  "root: {type: Sequential, children: ["
                  "{name: a, type: Linear, in_features: 3, out_features: 6},"
                  "{name: ln, type: LayerNorm, normalized_shape: 6, bias: false},"
                  "{name: b, type: Linear, in_features: 6, out_features: 2}]}",
                  LossKind::kMse, 3, 2},
        DenseCase{"identity_dropout_module_list",
                  "root: {type: Module, children: ["
                  "{name: a, type: Linear, in_features: 3, out_features: 4},"
                  "{name: drop, type: Dropout, attrs: {p: '0.5'}},"
                  "{name: list, type: ModuleList, children: [{name: id, type: Identity},"
                  " {name: b, type: Linear, in_features: 4, out_features: 2}]}]}",
                  LossKind::kMse, 3, 2},
        DenseCase{"residual",
                  "root: {type: Sequential, children: ["
                  "{name: a, type: Linear, in_features: 3, out_features: 4},"
                  "{name: res, type: Residual, children: ["
                  " {name: fc, type: Linear, in_features: 4, out_features: 4},"
                  " {name: act, type: GELU}]},"
                  "{name: b, type: Linear, in_features: 4, out_features: 2}]}",
                  LossKind::kMse, 3, 2},
        DenseCase{"mlp_like_example",
                  "root:\n"
                  "  type: Sequential\n"
                  "  children:\n"
                  "    - {name: input, type: Linear, in_features: 4, out_features: 6}\n"
                  "    - name: blocks\n"
                  "      repeat: 2\n"
                  "      template:\n"
                  "        type: Residual\n"
                  "        children:\n"
                  "          - {name: fc1, type: Linear, in_features: 6, out_features: 8}\n"
                  "          - {name: act, type: GELU}\n"
                  "          - {name: fc2, type: Linear, in_features: 8, out_features: 6}\n"
                  "    - {name: norm, type: LayerNorm, normalized_shape: 6}\n"
                  "    - {name: output, type: Linear, in_features: 6, out_features: 3}\n",
                  LossKind::kMse, 4, 3},
        DenseCase{"classifier_with_frozen_layer",
                  "root: {type: Sequential, children: ["
                  "{name: a, type: Linear, in_features: 3, out_features: 5, frozen: true},"
                  "{name: act, type: ReLU},"
                  "{name: b, type: Linear, in_features: 5, out_features: 4}]}",
                  LossKind::kCrossEntropy, 3, 4, 1e-3}));

// Token models: Embedding first, attention, and a whole tied GPT.
struct TokenCase {
  const char* name;
  const char* yaml;
  int64_t vocab;
  int64_t seq_len;
};

void PrintTo(const TokenCase& c, std::ostream* os) { *os << c.name; }

class TokenGradientTest : public ::testing::TestWithParam<TokenCase> {};

TEST_P(TokenGradientTest, MatchesFiniteDifferences) {
  const TokenCase& c = GetParam();
  auto tm = BuildTestModel(c.yaml, LossKind::kCrossEntropy, /*seed=*/9);
  ASSERT_TRUE(tm.ok()) << tm.status();
  ASSERT_TRUE(tm->model->takes_token_ids());
  const Batch batch = RandomTokenBatch(2, c.seq_len, c.vocab, /*seed=*/3);
  EXPECT_GT(ExpectGradientsMatchFiniteDifferences(*tm, batch), 0);
}

const std::string kTinyGpt = testutil::GptYaml(/*vocab=*/7, /*dim=*/8, /*context=*/6);

INSTANTIATE_TEST_SUITE_P(
    Layers, TokenGradientTest,
    ::testing::Values(
        TokenCase{"embedding",
                  "root: {type: Sequential, children: ["
                  "{name: emb, type: Embedding, num_embeddings: 6, embedding_dim: 4},"
                  "{name: head, type: Linear, in_features: 4, out_features: 6}]}",
                  6, 3},
        TokenCase{"causal_self_attention",
                  "root: {type: Sequential, children: ["
                  "{name: emb, type: Embedding, num_embeddings: 5, embedding_dim: 6},"
                  "{name: attn, type: CausalSelfAttention, attrs: {num_heads: '3'}, children: ["
                  " {name: c_attn, type: Linear, in_features: 6, out_features: 18},"
                  " {name: c_proj, type: Linear, in_features: 6, out_features: 6}]},"
                  "{name: head, type: Linear, in_features: 6, out_features: 5}]}",
                  5, 4},
        TokenCase{"tied_gpt", kTinyGpt.c_str(), 7, 5}));

}  // namespace
}  // namespace flatshard::compute
