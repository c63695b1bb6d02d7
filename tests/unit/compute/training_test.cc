// Tests that the pieces train together: a few steps of plain SGD on the
// synthetic data sets make the loss fall for an MLP on regression and
// classification, and for a small tied GPT on the token task.
#include <numeric>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/unit/compute/compute_test_util.h"
#include "worker/compute/data_source.h"

namespace flatshard::compute {
namespace {

// Runs `steps` SGD steps (p -= lr * grad) and returns the loss of every step.
std::vector<double> TrainSgd(testutil::TestModel& tm, DataSource& data, int steps, double lr) {
  NoopModuleHooks hooks;
  std::vector<double> losses;
  for (int step = 0; step < steps; ++step) {
    absl::StatusOr<Batch> batch = data.GetBatch(step, 0, 1);
    EXPECT_TRUE(batch.ok()) << batch.status();
    tm.store->ZeroGrads();
    absl::StatusOr<double> loss = tm.model->ForwardLoss(*batch, *tm.store, hooks);
    EXPECT_TRUE(loss.ok()) << loss.status();
    EXPECT_TRUE(tm.model->Backward(*tm.store, hooks).ok());
    if (!loss.ok()) return losses;
    losses.push_back(*loss);
    for (size_t p = 0; p < tm.index.params.size(); ++p) {
      const int i = static_cast<int>(p);
      if (tm.index.params[p].primary != i || !tm.store->trainable(i)) continue;
      std::span<float> v = tm.store->values(i);
      std::span<float> g = tm.store->grads(i);
      for (size_t e = 0; e < v.size(); ++e) v[e] -= static_cast<float>(lr) * g[e];
    }
  }
  return losses;
}

double Mean(const std::vector<double>& v, size_t begin, size_t end) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(begin),
                         v.begin() + static_cast<std::ptrdiff_t>(end), 0.0) /
         static_cast<double>(end - begin);
}

constexpr char kMlp[] =
    "root: {type: Sequential, children: ["
    "{name: fc1, type: Linear, in_features: 8, out_features: 64},"
    "{name: act, type: GELU},"
    "{name: fc2, type: Linear, in_features: 64, out_features: 4}]}";

TEST(TrainingTest, RegressionLossFalls) {
  DataSourceOptions o;
  o.kind = DataKind::kRegression;
  o.global_batch_size = 32;
  o.seed = 3;
  o.input_features = 8;
  o.output_features = 4;
  auto data = MakeDataSource(o);
  ASSERT_TRUE(data.ok()) << data.status();
  auto tm = testutil::BuildTestModel(kMlp, LossKind::kMse, /*seed=*/1);
  ASSERT_TRUE(tm.ok()) << tm.status();
  const std::vector<double> losses = TrainSgd(*tm, **data, 200, 0.05);
  ASSERT_EQ(losses.size(), 200u);
  const double first = Mean(losses, 0, 10), last = Mean(losses, 190, 200);
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
}

TEST(TrainingTest, ClassificationLossFalls) {
  DataSourceOptions o;
  o.kind = DataKind::kClassification;
  o.global_batch_size = 32;
  o.seed = 4;
  o.input_features = 8;
  o.output_features = 4;
  auto data = MakeDataSource(o);
  ASSERT_TRUE(data.ok()) << data.status();
  auto tm = testutil::BuildTestModel(kMlp, LossKind::kCrossEntropy, /*seed=*/2);
  ASSERT_TRUE(tm.ok()) << tm.status();
  const std::vector<double> losses = TrainSgd(*tm, **data, 200, 0.2);
  ASSERT_EQ(losses.size(), 200u);
  const double first = Mean(losses, 0, 10), last = Mean(losses, 190, 200);
  EXPECT_LT(last, 0.7 * first) << "first " << first << " last " << last;
}

TEST(TrainingTest, GptTokenLossFalls) {
  const std::string kGpt = testutil::GptYaml(/*vocab=*/16, /*dim=*/32, /*context=*/8);
  DataSourceOptions o;
  o.kind = DataKind::kTokens;
  o.global_batch_size = 16;
  o.seq_len = 8;
  o.vocab_size = 16;
  o.seed = 5;
  auto data = MakeDataSource(o);
  ASSERT_TRUE(data.ok()) << data.status();
  auto tm = testutil::BuildTestModel(kGpt, LossKind::kCrossEntropy, /*seed=*/3);
  ASSERT_TRUE(tm.ok()) << tm.status();
  const std::vector<double> losses = TrainSgd(*tm, **data, 150, 0.5);
  ASSERT_EQ(losses.size(), 150u);
  const double first = Mean(losses, 0, 10), last = Mean(losses, 140, 150);
  EXPECT_NEAR(first, std::log(16.0), 0.5);
  // The noise floor of the task is about 0.1 ln(16) + 0.33 = 0.6 nats.
  EXPECT_LT(last, 0.6 * first) << "first " << first << " last " << last;
}

}  // namespace
}  // namespace flatshard::compute
