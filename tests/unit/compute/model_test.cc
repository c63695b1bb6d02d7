// Tests worker/compute/model.h: which specs build (the examples included) and
// how the rest fail, naming the module; how bad batches and misuse fail; and
// the grad contract: accumulation, frozen parameters, tied parameters summing
// both uses into the primary, unused container parameters left alone.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "storage/spec_files.h"
#include "tests/unit/compute/compute_test_util.h"
#include "tests/unit/core/test_paths.h"

namespace flatshard::compute {
namespace {

using ::testing::HasSubstr;
using testutil::BuildTestModel;
using testutil::RandomDenseBatch;
using testutil::RandomTokenBatch;

struct BadModel {
  const char* name;
  const char* yaml;
  absl::StatusCode code;
  const char* expected;
};

void PrintTo(const BadModel& c, std::ostream* os) { *os << c.name; }

class BadModelTest : public ::testing::TestWithParam<BadModel> {};

TEST_P(BadModelTest, CreateFailsNamingTheModule) {
  auto tm = BuildTestModel(GetParam().yaml, LossKind::kMse);
  ASSERT_FALSE(tm.ok());
  EXPECT_EQ(tm.status().code(), GetParam().code) << tm.status();
  EXPECT_THAT(std::string(tm.status().message()), HasSubstr(GetParam().expected));
}

constexpr char kBlockOpen[] =
    "root: {type: Sequential, children: ["
    "{name: emb, type: Embedding, num_embeddings: 5, embedding_dim: 4},";

INSTANTIATE_TEST_SUITE_P(
    All, BadModelTest,
    ::testing::Values(
        BadModel{"multihead_attention",
                 "root: {type: Sequential, children: [{name: mha, type: MultiheadAttention, "
                 "embed_dim: 4}]}",
                 absl::StatusCode::kUnimplemented,
                 "module 'mha' (MultiheadAttention): has no compute"},
        BadModel{"module_dict",
                 "root: {type: ModuleDict, children: [{name: fc, type: Linear, in_features: 2, "
                 "out_features: 2}]}",
                 absl::StatusCode::kUnimplemented, "root module (ModuleDict): has no forward"},
        BadModel{"linear_widths",
                 "root: {type: Sequential, children: ["
                 "{name: a, type: Linear, in_features: 3, out_features: 4},"
                 "{name: b, type: Linear, in_features: 5, out_features: 2}]}",
                 absl::StatusCode::kInvalidArgument,
                 "test.yaml:1: module 'b' (Linear): its input has width 4 but its in_features "
                 "is 5"},
        BadModel{"layer_norm_width",
                 "root: {type: Sequential, children: ["
                 "{name: a, type: Linear, in_features: 3, out_features: 4},"
                 "{name: ln, type: LayerNorm, normalized_shape: 6}]}",
                 absl::StatusCode::kInvalidArgument,
                 "module 'ln' (LayerNorm): its input has width 4 but its normalized_shape is 6"},
        BadModel{"layer_norm_without_affine_width",
                 "root: {type: Sequential, children: ["
                 "{name: a, type: Linear, in_features: 3, out_features: 4},"
                 "{name: ln, type: LayerNorm, normalized_shape: 6, elementwise_affine: false}]}",
                 absl::StatusCode::kInvalidArgument,
                 "module 'ln' (LayerNorm): its input has width 4 but its normalized_shape is 6"},
        BadModel{"embedding_not_first",
                 "root: {type: Sequential, children: ["
                 "{name: a, type: Linear, in_features: 3, out_features: 4},"
                 "{name: emb, type: Embedding, num_embeddings: 5, embedding_dim: 4}]}",
                 absl::StatusCode::kInvalidArgument,
                 "module 'emb' (Embedding): takes token ids, so it must be the model's first"},
        BadModel{"gelu_attr",
                 "root: {type: Sequential, children: ["
                 "{name: a, type: Linear, in_features: 3, out_features: 4},"
                 "{name: act, type: GELU, attrs: {approximate: fast}}]}",
                 absl::StatusCode::kInvalidArgument,
                 "module 'act' (GELU): attrs.approximate must be 'none' or 'tanh', got 'fast'"},
        BadModel{"layer_norm_eps",
                 "root: {type: Sequential, children: ["
                 "{name: ln, type: LayerNorm, normalized_shape: 4, attrs: {eps: tiny}}]}",
                 absl::StatusCode::kInvalidArgument,
                 "module 'ln' (LayerNorm): attrs.eps must be a number >= 0, got 'tiny'"},
        BadModel{"residual_width",
                 "root: {type: Sequential, children: ["
                 "{name: a, type: Linear, in_features: 3, out_features: 4},"
                 "{name: r, type: Residual, children: ["
                 " {name: fc, type: Linear, in_features: 4, out_features: 2}]}]}",
                 absl::StatusCode::kInvalidArgument,
                 "module 'r' (Residual): its children map width 4 to 2"},
        BadModel{"attention_heads",
                 "root: {type: Sequential, children: ["
                 "{name: emb, type: Embedding, num_embeddings: 5, embedding_dim: 4},"
                 "{name: attn, type: CausalSelfAttention, attrs: {num_heads: '3'}, children: ["
                 " {name: c_attn, type: Linear, in_features: 4, out_features: 12},"
                 " {name: c_proj, type: Linear, in_features: 4, out_features: 4}]}]}",
                 absl::StatusCode::kInvalidArgument,
                 "module 'attn' (CausalSelfAttention): c_attn outputs 12 features; it must be "
                 "3 * C with C divisible by num_heads 3"},
        BadModel{"attention_no_heads",
                 "root: {type: Sequential, children: ["
                 "{name: emb, type: Embedding, num_embeddings: 5, embedding_dim: 4},"
                 "{name: attn, type: CausalSelfAttention, children: ["
                 " {name: c_attn, type: Linear, in_features: 4, out_features: 12},"
                 " {name: c_proj, type: Linear, in_features: 4, out_features: 4}]}]}",
                 absl::StatusCode::kInvalidArgument, "attrs.num_heads must be a positive integer"},
        BadModel{"attention_missing_child",
                 "root: {type: Sequential, children: ["
                 "{name: emb, type: Embedding, num_embeddings: 5, embedding_dim: 4},"
                 "{name: attn, type: CausalSelfAttention, attrs: {num_heads: '1'}, children: ["
                 " {name: c_attn, type: Linear, in_features: 4, out_features: 12}]}]}",
                 absl::StatusCode::kInvalidArgument,
                 "module 'attn' (CausalSelfAttention): needs a child named 'c_proj'"},
        BadModel{"block_missing_mlp",
                 "root: {type: Sequential, children: ["
                 "{name: emb, type: Embedding, num_embeddings: 5, embedding_dim: 4},"
                 "{name: blk, type: TransformerBlock, children: ["
                 " {name: ln_1, type: LayerNorm, normalized_shape: 4},"
                 " {name: attn, type: Identity}, {name: ln_2, type: LayerNorm, "
                 "normalized_shape: 4}]}]}",
                 absl::StatusCode::kInvalidArgument,
                 "module 'blk' (TransformerBlock): needs a child named 'mlp'"},
        BadModel{"block_residual_width",
                 "root: {type: Sequential, children: ["
                 "{name: emb, type: Embedding, num_embeddings: 5, embedding_dim: 4},"
                 "{name: blk, type: TransformerBlock, children: ["
                 " {name: ln_1, type: LayerNorm, normalized_shape: 4},"
                 " {name: attn, type: Identity}, {name: ln_2, type: LayerNorm, "
                 "normalized_shape: 4},"
                 " {name: mlp, type: Linear, in_features: 4, out_features: 3}]}]}",
                 absl::StatusCode::kInvalidArgument,
                 "child 'mlp' outputs width 3 but the residual stream is 4"},
        BadModel{"gpt_not_first",
                 "root: {type: Sequential, children: ["
                 "{name: a, type: Linear, in_features: 3, out_features: 4},"
                 "{name: g, type: GPT, children: []}]}",
                 absl::StatusCode::kInvalidArgument,
                 "module 'g' (GPT): takes token ids, so it must be the model's first"},
        BadModel{"gpt_missing_children",
                 "root: {type: GPT, children: ["
                 "{name: wte, type: Embedding, num_embeddings: 5, embedding_dim: 4}]}",
                 absl::StatusCode::kInvalidArgument,
                 "root module (GPT): needs a child named 'wpe'"}));

TEST(ModelTest, ExamplesBuildAndTrainOneStep) {
  {
    auto spec = LoadModelSpecFile(testing_paths::Example("mlp.yaml"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto index = IndexModel(*spec);
    ASSERT_TRUE(index.ok());
    testutil::TestDevice device;
    auto model = Model::Create(*spec, *index, LossKind::kMse, device.context());
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_FALSE((*model)->takes_token_ids());
    EXPECT_EQ((*model)->input_features(), 64);
    EXPECT_EQ((*model)->output_features(), 16);
    DenseParamStore store(*index);
    ASSERT_TRUE(store.Init(*index, 1).ok());
    NoopModuleHooks hooks;
    auto loss = (*model)->ForwardLoss(RandomDenseBatch(2, 64, 16, LossKind::kMse, 1), store, hooks);
    ASSERT_TRUE(loss.ok()) << loss.status();
    EXPECT_TRUE(std::isfinite(*loss));
    EXPECT_TRUE((*model)->Backward(store, hooks).ok());
  }
  {
    auto spec = LoadModelSpecFile(testing_paths::Example("gpt-7m.yaml"));
    ASSERT_TRUE(spec.ok()) << spec.status();
    auto index = IndexModel(*spec);
    ASSERT_TRUE(index.ok());
    testutil::TestDevice device;
    auto model = Model::Create(*spec, *index, LossKind::kCrossEntropy, device.context());
    ASSERT_TRUE(model.ok()) << model.status();
    EXPECT_TRUE((*model)->takes_token_ids());
    EXPECT_EQ((*model)->vocab_size(), 4096);
    EXPECT_EQ((*model)->output_features(), 4096);
    DenseParamStore store(*index);
    ASSERT_TRUE(store.Init(*index, 1).ok());
    NoopModuleHooks hooks;
    auto loss = (*model)->ForwardLoss(RandomTokenBatch(1, 8, 4096, 1), store, hooks);
    ASSERT_TRUE(loss.ok()) << loss.status();
    // Small initial weights: the first loss is close to ln(4096) = 8.318.
    EXPECT_NEAR(*loss, 8.318, 0.5);
    EXPECT_TRUE((*model)->Backward(store, hooks).ok());
  }
}

TEST(ModelTest, BadBatchesAreInvalidArgument) {
  auto dense = BuildTestModel(
      "root: {type: Sequential, children: [{name: fc, type: Linear, in_features: 3, "
      "out_features: 2}]}",
      LossKind::kMse);
  ASSERT_TRUE(dense.ok()) << dense.status();
  NoopModuleHooks hooks;
  auto message = [&](testutil::TestModel& tm, const Batch& batch) {
    auto loss = tm.model->ForwardLoss(batch, *tm.store, hooks);
    EXPECT_EQ(loss.status().code(), absl::StatusCode::kInvalidArgument) << loss.status();
    return std::string(loss.status().message());
  };
  EXPECT_THAT(message(*dense, RandomDenseBatch(2, 5, 2, LossKind::kMse, 1)),
              HasSubstr("inputs have 5 features, the model takes 3"));
  Batch empty = RandomDenseBatch(2, 3, 2, LossKind::kMse, 1);
  empty.batch_size = 0;
  EXPECT_THAT(message(*dense, empty), HasSubstr("batch_size (0) and seq_len (1) must be > 0"));
  EXPECT_THAT(message(*dense, RandomDenseBatch(2, 3, 4, LossKind::kMse, 1)),
              HasSubstr("targets are [2, 4] but the model output is [2, 2]"));

  auto tokens = BuildTestModel(
      "root: {type: Sequential, children: ["
      "{name: emb, type: Embedding, num_embeddings: 6, embedding_dim: 4},"
      "{name: head, type: Linear, in_features: 4, out_features: 6}]}",
      LossKind::kCrossEntropy);
  ASSERT_TRUE(tokens.ok()) << tokens.status();
  Batch batch = RandomTokenBatch(2, 3, 6, 1);
  batch.ids[1] = 9;
  EXPECT_THAT(message(*tokens, batch),
              HasSubstr("module 'emb' (Embedding): token id 9 at position 1 is outside [0, 6)"));
  batch = RandomTokenBatch(2, 3, 6, 1);
  batch.ids.pop_back();
  EXPECT_THAT(message(*tokens, batch), HasSubstr("needs batch_size * seq_len = 6 of them, got 5"));
  batch = RandomTokenBatch(2, 3, 6, 1);
  batch.labels.pop_back();
  EXPECT_THAT(message(*tokens, batch), HasSubstr("5 labels for 6 rows of logits"));
}

TEST(ModelTest, GptRejectsSequencesLongerThanWpe) {
  auto tm = BuildTestModel(
      "root: {type: GPT, children: ["
      "{name: wte, type: Embedding, num_embeddings: 5, embedding_dim: 4},"
      "{name: wpe, type: Embedding, num_embeddings: 2, embedding_dim: 4},"
      "{name: h, type: ModuleList, children: []},"
      "{name: ln_f, type: LayerNorm, normalized_shape: 4},"
      "{name: lm_head, type: Linear, in_features: 4, out_features: 5}]}",
      LossKind::kCrossEntropy);
  ASSERT_TRUE(tm.ok()) << tm.status();
  NoopModuleHooks hooks;
  auto loss = tm->model->ForwardLoss(RandomTokenBatch(1, 3, 5, 1), *tm->store, hooks);
  EXPECT_THAT(std::string(loss.status().message()),
              HasSubstr("root module (GPT): sequence length 3 exceeds the 2 positions of wpe"));
  EXPECT_TRUE(tm->model->ForwardLoss(RandomTokenBatch(1, 2, 5, 1), *tm->store, hooks).ok());
}

TEST(ModelTest, BackwardNeedsOneForwardEach) {
  auto tm = BuildTestModel(
      "root: {type: Sequential, children: [{name: fc, type: Linear, in_features: 3, "
      "out_features: 2}]}",
      LossKind::kMse);
  ASSERT_TRUE(tm.ok()) << tm.status();
  NoopModuleHooks hooks;
  EXPECT_EQ(tm->model->Backward(*tm->store, hooks).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(
      tm->model->ForwardLoss(RandomDenseBatch(2, 3, 2, LossKind::kMse, 1), *tm->store, hooks).ok());
  EXPECT_TRUE(tm->model->Backward(*tm->store, hooks).ok());
  EXPECT_EQ(tm->model->Backward(*tm->store, hooks).code(), absl::StatusCode::kFailedPrecondition);
}

class NoStorage : public ParamResolver {
 public:
  ParamSlot Resolve(int) override { return {}; }
};

TEST(ModelTest, MissingStorageNamesTheParameter) {
  auto tm = BuildTestModel(
      "root: {type: Sequential, children: [{name: fc, type: Linear, in_features: 3, "
      "out_features: 2}]}",
      LossKind::kMse);
  ASSERT_TRUE(tm.ok()) << tm.status();
  NoStorage none;
  NoopModuleHooks hooks;
  auto loss = tm->model->ForwardLoss(RandomDenseBatch(2, 3, 2, LossKind::kMse, 1), none, hooks);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(loss.status().message()),
              HasSubstr("module 'fc' (Linear): parameter 'fc.weight' has no storage"));
}

TEST(ModelTest, GradsAccumulateAndSkipFrozenAndUnusedParams) {
  auto tm = BuildTestModel(
      "root: {type: Module, params: [{name: scale, shape: [2]}], children: ["
      "{name: a, type: Linear, in_features: 3, out_features: 4, frozen: true},"
      "{name: b, type: Linear, in_features: 4, out_features: 2}]}",
      LossKind::kMse);
  ASSERT_TRUE(tm.ok()) << tm.status();
  DenseParamStore& store = *tm->store;
  NoopModuleHooks hooks;
  const Batch batch = RandomDenseBatch(2, 3, 2, LossKind::kMse, 1);
  ASSERT_TRUE(tm->model->ForwardLoss(batch, store, hooks).ok());
  ASSERT_TRUE(tm->model->Backward(store, hooks).ok());
  const int b_weight = tm->index.param_by_fqn.at("b.weight");
  const std::vector<float> once(store.grads(b_weight).begin(), store.grads(b_weight).end());
  ASSERT_TRUE(tm->model->ForwardLoss(batch, store, hooks).ok());
  ASSERT_TRUE(tm->model->Backward(store, hooks).ok());
  for (size_t i = 0; i < once.size(); ++i) {
    EXPECT_FLOAT_EQ(store.grads(b_weight)[i], 2 * once[i]);  // += , never =
  }
  EXPECT_TRUE(store.Resolve(tm->index.param_by_fqn.at("a.weight")).grad.empty());
  for (const char* untouched : {"scale", "a.weight", "a.bias"}) {
    for (float g : store.grads(tm->index.param_by_fqn.at(untouched))) {
      EXPECT_EQ(g, 0.0f) << untouched;
    }
  }
}

// A tied head accumulates into the embedding's grad: the tied model's grad is
// the untied model's embedding grad plus its head grad, for equal values.
TEST(ModelTest, TiedParamsSumBothUsesIntoThePrimary) {
  const std::string body =
      "root: {type: Sequential, children: ["
      "{name: emb, type: Embedding, num_embeddings: 4, embedding_dim: 3},"
      "{name: head, type: Linear, in_features: 3, out_features: 4, bias: false}]}";
  auto tied = BuildTestModel(body + "\ntied: [{alias: head.weight, primary: emb.weight}]",
                             LossKind::kCrossEntropy, 9);
  auto untied = BuildTestModel(body, LossKind::kCrossEntropy, 9);
  ASSERT_TRUE(tied.ok() && untied.ok());
  std::span<const float> shared = tied->store->values(0);
  std::copy(shared.begin(), shared.end(), untied->store->values(0).begin());
  std::copy(shared.begin(), shared.end(), untied->store->values(1).begin());
  NoopModuleHooks hooks;
  const Batch batch = RandomTokenBatch(2, 3, 4, 5);
  for (testutil::TestModel* tm : {&*tied, &*untied}) {
    ASSERT_TRUE(tm->model->ForwardLoss(batch, *tm->store, hooks).ok());
    ASSERT_TRUE(tm->model->Backward(*tm->store, hooks).ok());
  }
  for (size_t i = 0; i < 12; ++i) {
    EXPECT_NEAR(tied->store->grads(0)[i], untied->store->grads(0)[i] + untied->store->grads(1)[i],
                1e-6);
  }
  EXPECT_EQ(tied->store->grads(1).data(), tied->store->grads(0).data());  // one storage
}

TEST(ModelTest, IndexMustComeFromTheSpec) {
  auto a = BuildTestModel(
      "root: {type: Sequential, children: [{name: fc, type: Linear, in_features: 3, "
      "out_features: 2}]}",
      LossKind::kMse);
  auto b = BuildTestModel(
      "root: {type: Sequential, children: [{name: fc, type: Linear, in_features: 3, "
      "out_features: 2}, {name: act, type: ReLU}]}",
      LossKind::kMse);
  ASSERT_TRUE(a.ok() && b.ok());
  auto model = Model::Create(*a->spec, b->index, LossKind::kMse);
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(model.status().message()), HasSubstr("IndexModel(spec)"));
}

}  // namespace
}  // namespace flatshard::compute
