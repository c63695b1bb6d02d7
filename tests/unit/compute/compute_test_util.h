// Shared helpers of the worker/compute tests: build a Model and a dense
// parameter store from YAML, make random batches, and compare Backward's grads
// with central finite differences of ForwardLoss.
#ifndef FLATSHARD_TESTS_UNIT_COMPUTE_COMPUTE_TEST_UTIL_H_
#define FLATSHARD_TESTS_UNIT_COMPUTE_COMPUTE_TEST_UTIL_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "absl/strings/str_format.h"

#include "core/model_spec.h"
#include "core/model_spec_yaml.h"
#include "worker/compute/batch.h"
#include "worker/compute/dense_param_store.h"
#include "worker/compute/model.h"
#include "worker/compute/module_hooks.h"
#include "worker/compute/rng.h"
#include "worker/device/host/host_device.h"

namespace flatshard::compute::testutil {

// A 2-block GPT-2-style decoder (2 heads, MLP 4x wide) with the LM head tied to
// the token embedding, at the given vocabulary, width and context length.
inline std::string GptYaml(int vocab, int dim, int context) {
  return absl::StrFormat(R"(
root:
  type: GPT
  children:
    - {name: wte, type: Embedding, num_embeddings: %1$d, embedding_dim: %2$d}
    - {name: wpe, type: Embedding, num_embeddings: %3$d, embedding_dim: %2$d}
    - name: h
      type: ModuleList
      repeat: 2
      template:
        type: TransformerBlock
        children:
          - {name: ln_1, type: LayerNorm, normalized_shape: %2$d}
          - name: attn
            type: CausalSelfAttention
            attrs: {num_heads: "2"}
            children:
              - {name: c_attn, type: Linear, in_features: %2$d, out_features: %4$d}
              - {name: c_proj, type: Linear, in_features: %2$d, out_features: %2$d}
          - {name: ln_2, type: LayerNorm, normalized_shape: %2$d}
          - name: mlp
            type: MLP
            children:
              - {name: c_fc, type: Linear, in_features: %2$d, out_features: %5$d}
              - {name: act, type: GELU, attrs: {approximate: tanh}}
              - {name: c_proj, type: Linear, in_features: %5$d, out_features: %2$d}
    - {name: ln_f, type: LayerNorm, normalized_shape: %2$d}
    - {name: lm_head, type: Linear, in_features: %2$d, out_features: %1$d, bias: false}
tied:
  - {alias: lm_head.weight, primary: wte.weight}
)",
                         vocab, dim, context, 3 * dim, 4 * dim);
}

// The CPU device the compute tests run on: DenseParamStore keeps parameters in
// host memory, which is that device's memory.
struct TestDevice {
  std::shared_ptr<HostDevice> device = std::make_shared<HostDevice>();
  std::unique_ptr<Stream> stream = *device->CreateStream(StreamRole::kCompute, "compute");
  MemoryTracker memory;
  DeviceContext context() { return {device.get(), stream.get(), &memory}; }
};

struct TestModel {
  std::unique_ptr<TestDevice> device = std::make_unique<TestDevice>();
  std::unique_ptr<ModelSpec> spec;  // heap-held: `index` points into it
  ModelIndex index;
  std::unique_ptr<Model> model;
  std::unique_ptr<DenseParamStore> store;
};

// Parses `yaml` as "test.yaml", indexes it, creates the model and a store
// initialised with `seed`.
inline absl::StatusOr<TestModel> BuildTestModel(const std::string& yaml, LossKind loss,
                                                uint64_t seed = 1) {
  TestModel tm;
  absl::StatusOr<ModelSpec> spec = ParseModelSpec(yaml, "test.yaml");
  if (!spec.ok()) return spec.status();
  tm.spec = std::make_unique<ModelSpec>(*std::move(spec));
  absl::StatusOr<ModelIndex> index = IndexModel(*tm.spec);
  if (!index.ok()) return index.status();
  tm.index = *std::move(index);
  absl::StatusOr<std::unique_ptr<Model>> model =
      Model::Create(*tm.spec, tm.index, loss, tm.device->context());
  if (!model.ok()) return model.status();
  tm.model = *std::move(model);
  tm.store = std::make_unique<DenseParamStore>(tm.index);
  absl::Status init = tm.store->Init(tm.index, seed);
  if (!init.ok()) return init;
  return tm;
}

// Dense batch: inputs ~ N(0, 1); MSE targets ~ N(0, 1) or labels uniform in [0, classes).
inline Batch RandomDenseBatch(int64_t rows, int64_t in, int64_t out, LossKind loss, uint64_t seed) {
  const CounterRng rng = CounterRng(seed).Fork("test-batch");
  Batch batch;
  batch.batch_size = rows;
  batch.inputs = ZeroMatrix(rows, in);
  for (size_t i = 0; i < batch.inputs.values.size(); ++i) {
    batch.inputs.values[i] = static_cast<float>(rng.Normal(i));
  }
  if (loss == LossKind::kMse) {
    batch.targets = ZeroMatrix(rows, out);
    for (size_t i = 0; i < batch.targets.values.size(); ++i) {
      batch.targets.values[i] = static_cast<float>(rng.Fork("t").Normal(i));
    }
  } else {
    for (int64_t r = 0; r < rows; ++r) {
      batch.labels.push_back(static_cast<int32_t>(
          rng.Fork("l").Below(static_cast<uint64_t>(r), static_cast<uint64_t>(out))));
    }
  }
  return batch;
}

// Token batch: ids and labels uniform in [0, vocab), [batch * seq_len] each.
inline Batch RandomTokenBatch(int64_t batch_size, int64_t seq_len, int64_t vocab, uint64_t seed) {
  const CounterRng rng = CounterRng(seed).Fork("test-tokens");
  Batch batch;
  batch.batch_size = batch_size;
  batch.seq_len = seq_len;
  const auto v = static_cast<uint64_t>(vocab);
  for (int64_t i = 0; i < batch_size * seq_len; ++i) {
    batch.ids.push_back(static_cast<int32_t>(rng.Below(2 * static_cast<uint64_t>(i), v)));
    batch.labels.push_back(static_cast<int32_t>(rng.Below(2 * static_cast<uint64_t>(i) + 1, v)));
  }
  return batch;
}

struct GradCheckOptions {
  // Step of the finite differences on each parameter element. The float32
  // forward's rounding noise, divided by the step, is one error (about 2e-5 at
  // 1e-2 for the tiny GPT, 1e-4 at 1e-3), the stencil's truncation the other;
  // the fourth-order stencil below keeps truncation negligible at 1e-2 even
  // behind a LayerNorm of a low-variance row, where the plain central
  // difference is off by a percent.
  double eps = 1e-2;
  double atol = 5e-5;
  double rtol = 5e-3;
};

// For every element of every trainable primary parameter, compares the grad
// Backward accumulates with the fourth-order central difference
// (-L(p+2h) + 8 L(p+h) - 8 L(p-h) + L(p-2h)) / 12h. Returns the number of
// elements checked.
inline int64_t ExpectGradientsMatchFiniteDifferences(TestModel& tm, const Batch& batch,
                                                     GradCheckOptions options = {}) {
  NoopModuleHooks hooks;
  DenseParamStore& store = *tm.store;
  store.ZeroGrads();
  absl::StatusOr<double> loss = tm.model->ForwardLoss(batch, store, hooks);
  EXPECT_TRUE(loss.ok()) << loss.status();
  if (!loss.ok()) return 0;
  EXPECT_TRUE(std::isfinite(*loss));
  const absl::Status backward = tm.model->Backward(store, hooks);
  EXPECT_TRUE(backward.ok()) << backward;
  int64_t checked = 0;
  for (size_t p = 0; p < tm.index.params.size(); ++p) {
    const IndexedParam& param = tm.index.params[p];
    if (param.primary != static_cast<int>(p) || !param.spec->requires_grad) continue;
    const std::vector<float> grads(store.grads(static_cast<int>(p)).begin(),
                                   store.grads(static_cast<int>(p)).end());
    std::span<float> values = store.values(static_cast<int>(p));
    for (size_t e = 0; e < values.size(); ++e) {
      const float original = values[e];
      auto loss_at = [&](double offset) {
        values[e] = static_cast<float>(original + offset);
        return *tm.model->ForwardLoss(batch, store, hooks);
      };
      const double h = options.eps;
      const double numeric =
          (-loss_at(2 * h) + 8 * loss_at(h) - 8 * loss_at(-h) + loss_at(-2 * h)) / (12 * h);
      values[e] = original;
      const double analytic = grads[e];
      const double tolerance =
          options.atol + options.rtol * std::max(std::abs(numeric), std::abs(analytic));
      EXPECT_NEAR(analytic, numeric, tolerance) << param.fqn << "[" << e << "]";
      ++checked;
    }
  }
  return checked;
}

}  // namespace flatshard::compute::testutil

#endif  // FLATSHARD_TESTS_UNIT_COMPUTE_COMPUTE_TEST_UTIL_H_
