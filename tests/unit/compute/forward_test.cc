// Tests worker/compute's forward passes and losses against hand-computed
// values: Linear, LayerNorm (default and custom eps), GELU (erf and tanh, the
// values of torch.nn.functional.gelu), Embedding, causal attention, MSE and
// softmax cross-entropy (including its numerical stability), and causality of
// a whole GPT.
#include <cmath>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/status_macros.h"
#include "tests/unit/compute/compute_test_util.h"
#include "worker/compute/activation.h"
#include "worker/compute/loss.h"

namespace flatshard::compute {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::Pointwise;
using testutil::BuildTestModel;

constexpr float kTol = 1e-5f;

void Set(DenseParamStore& store, int param, const std::vector<float>& values) {
  std::span<float> dst = store.values(param);
  ASSERT_EQ(dst.size(), values.size());
  std::copy(values.begin(), values.end(), dst.begin());
}

HostMatrix Matrix(int64_t rows, int64_t cols, std::vector<float> values) {
  HostMatrix t;
  t.rows = rows;
  t.cols = cols;
  t.values = std::move(values);
  return t;
}

Batch DenseBatch(HostMatrix inputs, HostMatrix targets) {
  Batch batch;
  batch.batch_size = inputs.rows;
  batch.inputs = std::move(inputs);
  batch.targets = std::move(targets);
  return batch;
}

// The model output of the last forward, on the host.
std::vector<float> Output(const testutil::TestModel& tm) { return *tm.model->OutputToHost(); }

// A loss run on the CPU device: its value and gradient.
struct LossResult {
  double loss = 0;
  std::vector<float> grad;
};

absl::StatusOr<LossResult> CrossEntropyOnHost(const HostMatrix& logits,
                                              const std::vector<int32_t>& labels) {
  testutil::TestDevice device;
  const DeviceContext ctx = device.context();
  ASSIGN_OR_RETURN(Tensor in, TensorFromHost(ctx, logits.rows, logits.cols, logits.values));
  ASSIGN_OR_RETURN(DeviceBuffer label_buffer,
                   ctx.device->Allocate(labels.size() * sizeof(int32_t), *ctx.stream,
                                        MemoryKind::kActivations, nullptr));
  RETURN_IF_ERROR(ctx.stream->CopyToDevice(label_buffer.byte_span(),
                                           std::as_bytes(std::span<const int32_t>(labels))));
  ASSIGN_OR_RETURN(DeviceBuffer loss, ctx.device->Allocate(sizeof(double), *ctx.stream,
                                                           MemoryKind::kActivations, nullptr));
  Tensor grad;
  RETURN_IF_ERROR(CrossEntropyLoss(ctx, in, label_buffer.span<const int32_t>(), labels, grad,
                                   loss.span<double>()));
  LossResult result;
  ASSIGN_OR_RETURN(result.grad, TensorToHost(ctx, grad));
  result.loss = *HostDevice::HostAddress(loss.span<double>());
  return result;
}

absl::StatusOr<LossResult> MseOnHost(const HostMatrix& out, const HostMatrix& target) {
  testutil::TestDevice device;
  const DeviceContext ctx = device.context();
  ASSIGN_OR_RETURN(Tensor y, TensorFromHost(ctx, out.rows, out.cols, out.values));
  ASSIGN_OR_RETURN(Tensor t, TensorFromHost(ctx, target.rows, target.cols, target.values));
  ASSIGN_OR_RETURN(DeviceBuffer loss, ctx.device->Allocate(sizeof(double), *ctx.stream,
                                                           MemoryKind::kActivations, nullptr));
  Tensor grad;
  RETURN_IF_ERROR(MseLoss(ctx, y, t, grad, loss.span<double>()));
  LossResult result;
  ASSIGN_OR_RETURN(result.grad, TensorToHost(ctx, grad));
  result.loss = *HostDevice::HostAddress(loss.span<double>());
  return result;
}

TEST(ForwardTest, LinearIsXWTransposePlusBias) {
  auto tm = BuildTestModel(
      "root: {type: Sequential, children: [{name: fc, type: Linear, in_features: 2, "
      "out_features: 3}]}",
      LossKind::kMse);
  ASSERT_TRUE(tm.ok()) << tm.status();
  Set(*tm->store, 0, {1, 2, 3, 4, 5, 6});  // weight [3, 2]
  Set(*tm->store, 1, {0.5f, -1, 2});       // bias [3]
  NoopModuleHooks hooks;
  const Batch batch = DenseBatch(Matrix(2, 2, {1, -1, 0.5f, 2}), ZeroMatrix(2, 3));
  auto loss = tm->model->ForwardLoss(batch, *tm->store, hooks);
  ASSERT_TRUE(loss.ok()) << loss.status();
  // y = x W^T + b: [1-2+.5, 3-4-1, 5-6+2] and [.5+4+.5, 1.5+8-1, 2.5+12+2]
  EXPECT_THAT(Output(*tm),
              Pointwise(FloatNear(kTol), std::vector<float>{-0.5f, -2, 1, 5, 8.5f, 16.5f}));
  // MSE against zeros: mean of the squares over all 6 elements.
  EXPECT_NEAR(*loss, 374.75 / 6.0, 1e-9);
  EXPECT_EQ(tm->model->input_features(), 2);
  EXPECT_EQ(tm->model->output_features(), 3);
}

TEST(ForwardTest, LayerNormNormalisesEachRow) {
  auto tm = BuildTestModel(
      "root: {type: Sequential, children: [{name: ln, type: LayerNorm, normalized_shape: 4}]}",
      LossKind::kMse);
  ASSERT_TRUE(tm.ok()) << tm.status();
  Set(*tm->store, 0, {1, 2, 1, 1});  // weight
  Set(*tm->store, 1, {0, 0, 1, 0});  // bias
  NoopModuleHooks hooks;
  const Batch batch = DenseBatch(Matrix(1, 4, {1, 2, 3, 4}), ZeroMatrix(1, 4));
  ASSERT_TRUE(tm->model->ForwardLoss(batch, *tm->store, hooks).ok());
  // mean 2.5, biased var 1.25, eps 1e-5: (x - 2.5) / sqrt(1.25001) * w + b
  EXPECT_THAT(Output(*tm), Pointwise(FloatNear(kTol), std::vector<float>{-1.3416354f, -0.8944236f,
                                                                         1.4472118f, 1.3416354f}));
}

TEST(ForwardTest, LayerNormHonoursEpsAndNoAffine) {
  auto tm = BuildTestModel(
      "root: {type: Module, params: [{name: scale, shape: [1]}], children: [{name: ln, type: "
      "LayerNorm, normalized_shape: 4, elementwise_affine: false, attrs: {eps: '1e-3'}}]}",
      LossKind::kMse);
  ASSERT_TRUE(tm.ok()) << tm.status();
  NoopModuleHooks hooks;
  const Batch batch = DenseBatch(Matrix(1, 4, {1, 2, 3, 4}), ZeroMatrix(1, 4));
  ASSERT_TRUE(tm->model->ForwardLoss(batch, *tm->store, hooks).ok());
  EXPECT_THAT(Output(*tm), Pointwise(FloatNear(kTol), std::vector<float>{-1.3411045f, -0.4470348f,
                                                                         0.4470348f, 1.3411045f}));
}

TEST(ForwardTest, GeluMatchesTorchBothForms) {
  const std::vector<float> x = {-3, -1, -0.5f, 0, 0.5f, 1, 2, 3};
  // torch.nn.functional.gelu(x) and gelu(x, approximate='tanh'), in double.
  const std::vector<double> erf_form = {
      -0.00404969409489031, -0.15865525393145707, -0.15426876936299344, 0.0,
      0.34573123063700656,  0.8413447460685429,   1.9544997361036416,   2.99595030590511};
  const std::vector<double> tanh_form = {
      -0.0036373920817729943, -0.15880800939172324, -0.15428599017485606, 0.0,
      0.34571400982514394,    0.8411919906082768,   1.954597694087775,    2.996362607918227};
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_NEAR(GeluErf(x[i]), erf_form[i], 1e-6) << x[i];
    EXPECT_NEAR(GeluTanh(x[i]), tanh_form[i], 1e-6) << x[i];
  }
  // The same through the model, with the attr spelled as in a spec.
  for (const char* approximate : {"none", "tanh"}) {
    auto tm = BuildTestModel(
        std::string("root: {type: Module, params: [{name: p, shape: [1]}], children: [{name: "
                    "act, type: GELU, attrs: {approximate: ") +
            approximate + "}}]}",
        LossKind::kMse);
    ASSERT_TRUE(tm.ok()) << tm.status();
    NoopModuleHooks hooks;
    const Batch batch = DenseBatch(Matrix(1, 8, x), ZeroMatrix(1, 8));
    ASSERT_TRUE(tm->model->ForwardLoss(batch, *tm->store, hooks).ok());
    const std::vector<double>& want = std::string(approximate) == "tanh" ? tanh_form : erf_form;
    for (size_t i = 0; i < x.size(); ++i) {
      EXPECT_NEAR(Output(*tm)[i], want[i], 1e-6) << approximate << " " << x[i];
    }
  }
}

TEST(ForwardTest, SoftmaxCrossEntropyMatchesHandComputedValues) {
  // log(e + e^2 + e^3) = 3.40760596444438
  const HostMatrix logits = Matrix(2, 3, {1, 2, 3, 1, 2, 3});
  const std::vector<int32_t> labels = {2, 0};
  auto result = CrossEntropyOnHost(logits, labels);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NEAR(result->loss, (0.40760596444438013 + 2.40760596444438) / 2.0, 1e-7);
  // (softmax - onehot) / N
  const float s0 = 0.09003057f, s1 = 0.24472847f, s2 = 0.66524096f;
  EXPECT_THAT(result->grad,
              Pointwise(FloatNear(1e-6f), std::vector<float>{s0 / 2, s1 / 2, (s2 - 1) / 2,
                                                             (s0 - 1) / 2, s1 / 2, s2 / 2}));
}

TEST(ForwardTest, CrossEntropyIsStableForHugeLogits) {
  const HostMatrix logits = Matrix(2, 3, {1000, 0, -1000, 1000, 0, -1000});
  const std::vector<int32_t> labels = {0, 2};
  auto result = CrossEntropyOnHost(logits, labels);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_NEAR(result->loss, (0.0 + 2000.0) / 2.0, 1e-6);
  for (float g : result->grad) EXPECT_TRUE(std::isfinite(g));
  EXPECT_NEAR(result->grad[5], -0.5f, 1e-6f);
}

TEST(ForwardTest, LossErrorsNameTheProblem) {
  const std::vector<int32_t> bad_label = {3};
  EXPECT_THAT(
      std::string(CrossEntropyOnHost(Matrix(1, 3, {0, 0, 0}), bad_label).status().message()),
      ::testing::HasSubstr("label 3 of row 0 is outside [0, 3)"));
  EXPECT_THAT(std::string(MseOnHost(Matrix(1, 2, {0, 0}), Matrix(2, 1, {0, 0})).status().message()),
              ::testing::HasSubstr("targets are [2, 1] but the model output is [1, 2]"));
}

TEST(ForwardTest, MseIsTheMeanOverAllElements) {
  auto result = MseOnHost(Matrix(2, 2, {1, 2, 3, 4}), Matrix(2, 2, {0, 0, 0, 1}));
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_DOUBLE_EQ(result->loss, (1 + 4 + 9 + 9) / 4.0);
  EXPECT_THAT(result->grad, ElementsAre(0.5f, 1.0f, 1.5f, 1.5f));  // 2 (y - t) / 4
}

// One head, C = 2, T = 2: q = k = x, v = Wv x, c_proj = identity, so the
// second position mixes v0 and v1 with softmax([0, 1/sqrt 2]).
TEST(ForwardTest, CausalAttentionByHand) {
  auto tm = BuildTestModel(
      "root: {type: Sequential, children: ["
      "{name: emb, type: Embedding, num_embeddings: 2, embedding_dim: 2},"
      "{name: attn, type: CausalSelfAttention, attrs: {num_heads: '1'}, children: ["
      " {name: c_attn, type: Linear, in_features: 2, out_features: 6},"
      " {name: c_proj, type: Linear, in_features: 2, out_features: 2}]}]}",
      LossKind::kCrossEntropy);
  ASSERT_TRUE(tm.ok()) << tm.status();
  DenseParamStore& store = *tm->store;
  Set(store, 0, {1, 0, 0, 1});                          // emb: identity
  Set(store, 1, {1, 0, 0, 1, 1, 0, 0, 1, 1, 2, 3, 4});  // c_attn: Wq = Wk = I, Wv = [[1,2],[3,4]]
  Set(store, 2, {0, 0, 0, 0, 0, 0});
  Set(store, 3, {1, 0, 0, 1});  // c_proj: identity
  Set(store, 4, {0, 0});
  Batch batch;
  batch.batch_size = 1;
  batch.seq_len = 2;
  batch.ids = {0, 1};
  batch.labels = {0, 0};
  NoopModuleHooks hooks;
  ASSERT_TRUE(tm->model->ForwardLoss(batch, store, hooks).ok());
  const float p1 = 0.66976155f;  // 1 / (1 + exp(-1/sqrt 2))
  EXPECT_THAT(Output(*tm), Pointwise(FloatNear(kTol), std::vector<float>{1, 3, 1 + p1, 3 + p1}));
}

TEST(ForwardTest, GptIsCausalAndUsesPositions) {
  auto tm = BuildTestModel(
      R"(
root:
  type: GPT
  children:
    - {name: wte, type: Embedding, num_embeddings: 5, embedding_dim: 4}
    - {name: wpe, type: Embedding, num_embeddings: 4, embedding_dim: 4}
    - name: h
      type: ModuleList
      children:
        - name: "0"
          type: TransformerBlock
          children:
            - {name: ln_1, type: LayerNorm, normalized_shape: 4}
            - name: attn
              type: CausalSelfAttention
              attrs: {num_heads: "2"}
              children:
                - {name: c_attn, type: Linear, in_features: 4, out_features: 12}
                - {name: c_proj, type: Linear, in_features: 4, out_features: 4}
            - {name: ln_2, type: LayerNorm, normalized_shape: 4}
            - name: mlp
              type: MLP
              children:
                - {name: c_fc, type: Linear, in_features: 4, out_features: 8}
                - {name: act, type: GELU}
                - {name: c_proj, type: Linear, in_features: 8, out_features: 4}
    - {name: ln_f, type: LayerNorm, normalized_shape: 4}
    - {name: lm_head, type: Linear, in_features: 4, out_features: 5, bias: false}
)",
      LossKind::kCrossEntropy, /*seed=*/3);
  ASSERT_TRUE(tm.ok()) << tm.status();
  NoopModuleHooks hooks;
  Batch a;
  a.batch_size = 1;
  a.seq_len = 4;
  a.ids = {1, 2, 3, 4};
  a.labels = {0, 0, 0, 0};
  Batch b = a;
  b.ids[3] = 0;  // change only the last token
  ASSERT_TRUE(tm->model->ForwardLoss(a, *tm->store, hooks).ok());
  const std::vector<float> out_a = Output(*tm);
  ASSERT_TRUE(tm->model->ForwardLoss(b, *tm->store, hooks).ok());
  const std::vector<float> out_b = Output(*tm);
  ASSERT_EQ(out_a.size(), 20u);
  for (size_t i = 0; i < 15; ++i) {
    EXPECT_EQ(out_a[i], out_b[i]) << "earlier position changed at " << i;
  }
  EXPECT_NE(std::vector<float>(out_a.begin() + 15, out_a.end()),
            std::vector<float>(out_b.begin() + 15, out_b.end()));
  // The same token at two positions gives different logits: wpe is added.
  Batch same = a;
  same.ids = {2, 2, 2, 2};
  ASSERT_TRUE(tm->model->ForwardLoss(same, *tm->store, hooks).ok());
  const std::vector<float> out = Output(*tm);
  EXPECT_NE(std::vector<float>(out.begin(), out.begin() + 5),
            std::vector<float>(out.begin() + 5, out.begin() + 10));
}

}  // namespace
}  // namespace flatshard::compute
