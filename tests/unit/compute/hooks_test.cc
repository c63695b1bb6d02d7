// Tests worker/compute/module_hooks.h as Model drives it: the exact PyTorch
// module-hook order in forward and backward for nested containers and a GPT,
// parameters resolved only while their module's hooks are open, storage that
// moves between forward and backward (FSDP's reshard + re-gather), and hook
// errors aborting the pass.
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"

#include "tests/unit/compute/compute_test_util.h"

namespace flatshard::compute {
namespace {

using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using testutil::BuildTestModel;

// Records "F<m" (BeforeForward), "F>m" (AfterForward), "B<m", "B>m".
class RecordingHooks : public ModuleHooks {
 public:
  absl::Status BeforeForward(int m) override { return Record("F<", m); }
  absl::Status AfterForward(int m) override { return Record("F>", m); }
  absl::Status BeforeBackward(int m) override { return Record("B<", m); }
  absl::Status AfterBackward(int m) override { return Record("B>", m); }

  std::vector<std::string> events;
  std::string fail_on;  // an event to answer with an error

 private:
  absl::Status Record(const char* what, int m) {
    events.push_back(absl::StrCat(what, m));
    if (events.back() == fail_on) {
      return absl::AbortedError(absl::StrCat("hook failed at ", fail_on));
    }
    return absl::OkStatus();
  }
};

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == ' ') {
      if (!cur.empty()) out.push_back(cur);
      cur.clear();
    } else {
      cur.push_back(c);
    }
  }
  if (!cur.empty()) out.push_back(cur);
  return out;
}

// Pre-order: 0 root, 1 a, 2 r, 3 r.fc, 4 r.act, 5 head.
constexpr char kNested[] =
    "root: {type: Sequential, children: ["
    "{name: a, type: Linear, in_features: 3, out_features: 4},"
    "{name: r, type: Residual, children: ["
    " {name: fc, type: Linear, in_features: 4, out_features: 4},"
    " {name: act, type: ReLU}]},"
    "{name: head, type: Linear, in_features: 4, out_features: 2}]}";

TEST(HooksTest, NestedModelFollowsPyTorchOrder) {
  auto tm = BuildTestModel(kNested, LossKind::kMse);
  ASSERT_TRUE(tm.ok()) << tm.status();
  RecordingHooks hooks;
  const Batch batch = testutil::RandomDenseBatch(2, 3, 2, LossKind::kMse, 1);
  ASSERT_TRUE(tm->model->ForwardLoss(batch, *tm->store, hooks).ok());
  EXPECT_THAT(hooks.events,
              ElementsAreArray(Split("F<0 F<1 F>1 F<2 F<3 F>3 F<4 F>4 F>2 F<5 F>5 F>0")));
  hooks.events.clear();
  ASSERT_TRUE(tm->model->Backward(*tm->store, hooks).ok());
  EXPECT_THAT(hooks.events,
              ElementsAreArray(Split("B<0 B<5 B>5 B<2 B<4 B>4 B<3 B>3 B>2 B<1 B>1 B>0")));
}

TEST(HooksTest, GptFollowsExecutionOrder) {
  auto tm = BuildTestModel(R"(
root:
  type: GPT
  children:
    - {name: wte, type: Embedding, num_embeddings: 5, embedding_dim: 4}
    - {name: wpe, type: Embedding, num_embeddings: 3, embedding_dim: 4}
    - name: h
      type: ModuleList
      repeat: 1
      template:
        type: TransformerBlock
        children:
          - {name: ln_1, type: LayerNorm, normalized_shape: 4}
          - name: attn
            type: CausalSelfAttention
            attrs: {num_heads: "1"}
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
tied:
  - {alias: lm_head.weight, primary: wte.weight}
)",
                           LossKind::kCrossEntropy);
  ASSERT_TRUE(tm.ok()) << tm.status();
  // Pre-order: 0 GPT, 1 wte, 2 wpe, 3 h, 4 h.0, 5 ln_1, 6 attn, 7 c_attn, 8 c_proj,
  // 9 ln_2, 10 mlp, 11 c_fc, 12 act, 13 mlp.c_proj, 14 ln_f, 15 lm_head.
  ASSERT_EQ(tm->index.modules[13].fqn, "h.0.mlp.c_proj");
  RecordingHooks hooks;
  const Batch batch = testutil::RandomTokenBatch(2, 3, 5, 1);
  ASSERT_TRUE(tm->model->ForwardLoss(batch, *tm->store, hooks).ok());
  EXPECT_THAT(hooks.events,
              ElementsAreArray(Split("F<0 F<1 F>1 F<2 F>2 F<3 F<4 F<5 F>5 F<6 F<7 F>7 F<8 F>8 F>6 "
                                     "F<9 F>9 F<10 F<11 F>11 F<12 F>12 F<13 F>13 F>10 F>4 F>3 "
                                     "F<14 F>14 F<15 F>15 F>0")));
  hooks.events.clear();
  ASSERT_TRUE(tm->model->Backward(*tm->store, hooks).ok());
  EXPECT_THAT(hooks.events,
              ElementsAreArray(Split("B<0 B<15 B>15 B<14 B>14 B<3 B<4 B<10 B<13 B>13 B<12 B>12 "
                                     "B<11 B>11 B>10 B<9 B>9 B<6 B<8 B>8 B<7 B>7 B>6 B<5 B>5 B>4 "
                                     "B>3 B<2 B>2 B<1 B>1 B>0")));
}

// A resolver that only hands out storage while the parameter's own module is
// the innermost open one, and after a reshard moves every parameter to a fresh
// buffer (poisoning the old one), as FSDP does between forward and backward.
class StrictMovingResolver : public ParamResolver, public ModuleHooks {
 public:
  explicit StrictMovingResolver(testutil::TestModel& tm) : tm_(tm) { Regather(); }

  ParamSlot Resolve(int p) override {
    const int owner = tm_.index.params[static_cast<size_t>(p)].module;
    if (open_.empty() || open_.back() != owner) {
      ADD_FAILURE() << "parameter " << tm_.index.params[static_cast<size_t>(p)].fqn
                    << " resolved outside its module's hooks";
      return {};
    }
    const auto primary = static_cast<size_t>(tm_.index.params[static_cast<size_t>(p)].primary);
    return {DeviceSpan<float>(values_[primary].data(), values_[primary].size()),
            DeviceSpan<float>(grads_[primary].data(), grads_[primary].size())};
  }

  absl::Status BeforeForward(int m) override { return Open(m); }
  absl::Status AfterForward(int m) override { return Close(m); }
  absl::Status BeforeBackward(int m) override {
    if (m == 0) Regather();  // the root re-gathers into new storage before backward
    return Open(m);
  }
  absl::Status AfterBackward(int m) override { return Close(m); }

  std::vector<std::vector<float>> grads_;

 private:
  void Regather() {
    std::vector<std::vector<float>> fresh;
    for (size_t p = 0; p < tm_.index.params.size(); ++p) {
      std::span<float> v = tm_.store->values(static_cast<int>(p));
      fresh.emplace_back(v.begin(), v.end());
    }
    for (std::vector<float>& old : values_) std::fill(old.begin(), old.end(), std::nanf(""));
    retired_.push_back(std::move(values_));  // keep the poisoned buffers alive
    values_ = std::move(fresh);
    if (grads_.empty()) {
      for (const std::vector<float>& v : values_) grads_.emplace_back(v.size(), 0.0f);
    }
  }
  absl::Status Open(int m) {
    open_.push_back(m);
    return absl::OkStatus();
  }
  absl::Status Close(int m) {
    EXPECT_EQ(open_.back(), m);
    open_.pop_back();
    return absl::OkStatus();
  }

  testutil::TestModel& tm_;
  std::vector<int> open_;
  std::vector<std::vector<float>> values_;
  std::vector<std::vector<std::vector<float>>> retired_;
};

TEST(HooksTest, ParamsResolvedInsideTheirModuleAndReResolvedAfterStorageMoves) {
  auto tm = BuildTestModel(kNested, LossKind::kMse);
  ASSERT_TRUE(tm.ok()) << tm.status();
  const Batch batch = testutil::RandomDenseBatch(3, 3, 2, LossKind::kMse, 4);
  // Reference grads from the plain store.
  NoopModuleHooks noop;
  tm->store->ZeroGrads();
  ASSERT_TRUE(tm->model->ForwardLoss(batch, *tm->store, noop).ok());
  ASSERT_TRUE(tm->model->Backward(*tm->store, noop).ok());

  StrictMovingResolver moving(*tm);
  ASSERT_TRUE(tm->model->ForwardLoss(batch, moving, moving).ok());
  ASSERT_TRUE(tm->model->Backward(moving, moving).ok());
  for (size_t p = 0; p < tm->index.params.size(); ++p) {
    std::span<float> want = tm->store->grads(static_cast<int>(p));
    EXPECT_THAT(moving.grads_[p], ElementsAreArray(want.begin(), want.end()))
        << tm->index.params[p].fqn;
  }
}

TEST(HooksTest, HookErrorsAbortThePass) {
  auto tm = BuildTestModel(kNested, LossKind::kMse);
  ASSERT_TRUE(tm.ok()) << tm.status();
  const Batch batch = testutil::RandomDenseBatch(2, 3, 2, LossKind::kMse, 1);
  RecordingHooks hooks;
  hooks.fail_on = "F<3";
  auto loss = tm->model->ForwardLoss(batch, *tm->store, hooks);
  EXPECT_EQ(loss.status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(hooks.events.back(), "F<3");  // nothing ran after the failing hook
  // No backward through a failed forward.
  EXPECT_EQ(tm->model->Backward(*tm->store, hooks).code(), absl::StatusCode::kFailedPrecondition);

  hooks.fail_on = "B>2";
  hooks.events.clear();
  ASSERT_TRUE(tm->model->ForwardLoss(batch, *tm->store, hooks).ok());
  const absl::Status backward = tm->model->Backward(*tm->store, hooks);
  EXPECT_EQ(backward.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(std::string(backward.message()), HasSubstr("hook failed at B>2"));
}

}  // namespace
}  // namespace flatshard::compute
