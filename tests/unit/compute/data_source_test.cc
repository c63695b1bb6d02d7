// Tests worker/compute/data_source.h and the synthetic data sets: a global
// batch is the same bytes however many ranks split it (W = 1, 2, 4), steps and
// seeds differ, partitions that do not divide fail, options are validated, the
// teacher targets and token chains have the promised structure, and pinned
// values catch any change to the generated data.
#include "worker/compute/data_source.h"

#include <cstring>
#include <set>
#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "worker/compute/teacher_data.h"
#include "worker/compute/token_data.h"

namespace flatshard::compute {
namespace {

using ::testing::HasSubstr;

template <typename T>
void Append(std::string& out, const std::vector<T>& v) {
  out.append(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

// Every rank's batch of `step`, each field concatenated in rank order, as bytes.
std::string GlobalBatchBytes(DataSource& data, int64_t step, int world_size) {
  std::string inputs, targets, ids, labels;
  for (int rank = 0; rank < world_size; ++rank) {
    absl::StatusOr<Batch> batch = data.GetBatch(step, rank, world_size);
    EXPECT_TRUE(batch.ok()) << batch.status();
    if (!batch.ok()) return "";
    Append(inputs, batch->inputs.values);
    Append(targets, batch->targets.values);
    Append(ids, batch->ids);
    Append(labels, batch->labels);
  }
  return inputs + "|" + targets + "|" + ids + "|" + labels;
}

DataSourceOptions Options(DataKind kind) {
  DataSourceOptions o;
  o.kind = kind;
  o.global_batch_size = 8;
  o.seed = 5;
  o.input_features = 6;
  o.output_features = 3;
  o.vocab_size = 11;
  o.seq_len = 4;
  return o;
}

class SyntheticDataTest : public ::testing::TestWithParam<DataKind> {};

TEST_P(SyntheticDataTest, SameSamplesWhateverTheWorldSize) {
  auto data = MakeDataSource(Options(GetParam()));
  ASSERT_TRUE(data.ok()) << data.status();
  for (int64_t step : {0, 1, 7}) {
    const std::string whole = GlobalBatchBytes(**data, step, 1);
    ASSERT_FALSE(whole.empty());
    EXPECT_EQ(GlobalBatchBytes(**data, step, 2), whole) << "step " << step;
    EXPECT_EQ(GlobalBatchBytes(**data, step, 4), whole) << "step " << step;
  }
  auto b = (*data)->GetBatch(0, 1, 4);
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->batch_size, 2);
}

TEST_P(SyntheticDataTest, StepsAndSeedsDifferInstancesAgree) {
  auto data = MakeDataSource(Options(GetParam()));
  auto again = MakeDataSource(Options(GetParam()));
  DataSourceOptions other_seed = Options(GetParam());
  other_seed.seed = 6;
  auto other = MakeDataSource(other_seed);
  ASSERT_TRUE(data.ok() && again.ok() && other.ok());
  EXPECT_EQ(GlobalBatchBytes(**data, 3, 2), GlobalBatchBytes(**again, 3, 2));
  EXPECT_NE(GlobalBatchBytes(**data, 3, 2), GlobalBatchBytes(**data, 4, 2));
  EXPECT_NE(GlobalBatchBytes(**data, 3, 2), GlobalBatchBytes(**other, 3, 2));
}

TEST_P(SyntheticDataTest, PartitionErrors) {
  auto data = MakeDataSource(Options(GetParam()));
  ASSERT_TRUE(data.ok());
  auto message = [&](int64_t step, int rank, int world) {
    auto batch = (*data)->GetBatch(step, rank, world);
    EXPECT_EQ(batch.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(batch.status().message());
  };
  EXPECT_THAT(message(0, 0, 3),
              HasSubstr("global batch size 8 must be a positive multiple of the world size 3"));
  EXPECT_THAT(message(0, 4, 4), HasSubstr("rank 4 is outside [0, 4)"));
  EXPECT_THAT(message(0, -1, 4), HasSubstr("rank -1 is outside [0, 4)"));
  EXPECT_THAT(message(-1, 0, 4), HasSubstr("step -1 must be >= 0"));
  EXPECT_THAT(message(0, 0, 0), HasSubstr("world size 0 must be > 0"));
}

INSTANTIATE_TEST_SUITE_P(Kinds, SyntheticDataTest,
                         ::testing::Values(DataKind::kRegression, DataKind::kClassification,
                                           DataKind::kTokens),
                         [](const auto& param_info) {
                           return std::string(DataKindName(param_info.param));
                         });

TEST(DataSourceTest, OptionsAreValidated) {
  auto message = [](const DataSourceOptions& o) {
    auto data = MakeDataSource(o);
    EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(data.status().message());
  };
  DataSourceOptions o = Options(DataKind::kRegression);
  o.input_features = 0;
  EXPECT_THAT(message(o), HasSubstr("regression data set: input_features must be > 0, got 0"));
  o = Options(DataKind::kClassification);
  o.output_features = 1;
  EXPECT_THAT(message(o), HasSubstr("classification data set: output_features must be >= 2"));
  o = Options(DataKind::kTokens);
  o.vocab_size = 1;
  EXPECT_THAT(message(o), HasSubstr("tokens data set: vocab_size must be in [2, 2^31), got 1"));
  o = Options(DataKind::kTokens);
  o.global_batch_size = 0;
  EXPECT_THAT(message(o), HasSubstr("global_batch_size must be > 0, got 0"));
  o = Options(DataKind::kNpy);
  EXPECT_THAT(message(o), HasSubstr("path (the directory of .npy files) is required"));
}

TEST(DataSourceTest, KindNamesRoundTrip) {
  for (DataKind kind :
       {DataKind::kRegression, DataKind::kClassification, DataKind::kTokens, DataKind::kNpy}) {
    auto parsed = ParseDataKind(DataKindName(kind));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, kind);
  }
  EXPECT_THAT(std::string(ParseDataKind("images").status().message()),
              HasSubstr("unknown data set kind 'images'"));
}

TEST(DataSourceTest, ClassificationLabelsAreTheTeachersArgmax) {
  DataSourceOptions o = Options(DataKind::kClassification);
  o.global_batch_size = 256;
  auto data = TeacherDataSource::Create(o, TeacherDataSource::Task::kClassification);
  ASSERT_TRUE(data.ok());
  EXPECT_EQ((*data)->loss(), LossKind::kCrossEntropy);
  auto batch = (*data)->GetBatch(0, 0, 1);
  ASSERT_TRUE(batch.ok());
  std::set<int32_t> classes;
  std::vector<double> y(3);
  for (int64_t i = 0; i < 256; ++i) {
    (*data)->Teacher(std::span<const float>(batch->inputs.Row(i), 6), y);
    const int32_t label = batch->labels[static_cast<size_t>(i)];
    ASSERT_GE(label, 0);
    ASSERT_LT(label, 3);
    for (double v : y) EXPECT_LE(v, y[static_cast<size_t>(label)]);
    classes.insert(label);
  }
  EXPECT_EQ(classes.size(), 3u);
}

TEST(DataSourceTest, RegressionTargetsHaveUnitScale) {
  DataSourceOptions o = Options(DataKind::kRegression);
  o.global_batch_size = 512;
  auto data = MakeDataSource(o);
  ASSERT_TRUE(data.ok());
  EXPECT_EQ((*data)->loss(), LossKind::kMse);
  auto batch = (*data)->GetBatch(0, 0, 1);
  ASSERT_TRUE(batch.ok());
  double sum2 = 0;
  for (float t : batch->targets.values) sum2 += t * t;
  const double rms = std::sqrt(sum2 / static_cast<double>(batch->targets.values.size()));
  EXPECT_GT(rms, 0.3);
  EXPECT_LT(rms, 3.0);
}

TEST(DataSourceTest, TokensFollowTheNoisyPermutation) {
  DataSourceOptions o = Options(DataKind::kTokens);
  o.global_batch_size = 64;
  o.seq_len = 32;
  auto data = TokenDataSource::Create(o);
  ASSERT_TRUE(data.ok());
  auto batch = (*data)->GetBatch(2, 0, 1);
  ASSERT_TRUE(batch.ok());
  ASSERT_EQ(batch->ids.size(), 64u * 32u);
  ASSERT_EQ(batch->labels.size(), batch->ids.size());
  EXPECT_EQ(batch->seq_len, 32);
  const std::vector<int32_t>& perm = (*data)->permutation();
  int follows = 0;
  for (size_t i = 0; i < batch->ids.size(); ++i) {
    ASSERT_GE(batch->ids[i], 0);
    ASSERT_LT(batch->ids[i], 11);
    if (i % 32 != 31) {
      EXPECT_EQ(batch->labels[i], batch->ids[i + 1]);  // next-token labels
    }
    follows += batch->labels[i] == perm[static_cast<size_t>(batch->ids[i])];
  }
  const double rate = follows / static_cast<double>(batch->ids.size());
  EXPECT_NEAR(rate, 0.9 + 0.1 / 11, 0.03);
}

// Pinned values: a change here changes every run's data. Computed once; the
// generator uses only exactly rounded IEEE-754 operations, so every platform
// must reproduce them bit for bit.
TEST(DataSourceTest, PinnedValues) {
  auto regression = MakeDataSource(Options(DataKind::kRegression));
  auto tokens = MakeDataSource(Options(DataKind::kTokens));
  ASSERT_TRUE(regression.ok() && tokens.ok());
  auto r = (*regression)->GetBatch(1, 0, 1);
  auto t = (*tokens)->GetBatch(1, 0, 1);
  ASSERT_TRUE(r.ok() && t.ok());
  EXPECT_EQ(r->inputs.values[0], 0x1.2612d4p+1f);
  EXPECT_EQ(r->targets.values[0], 0x1.c9f752p+1f);
  EXPECT_EQ(t->ids, (std::vector<int32_t>{5, 8, 2, 3, 5, 8, 2, 3, 4, 6, 1, 5, 2, 3, 4, 6,
                                          5, 8, 2, 3, 6, 1, 5, 8, 4, 6, 1, 5, 4, 6, 1, 5}));
}

}  // namespace
}  // namespace flatshard::compute
