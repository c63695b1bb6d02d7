#include "worker/compute/teacher_data.h"

#include <cmath>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard::compute {
namespace {

// N(0, scale^2) values n0, n0+1, ... of `rng`.
std::vector<double> NormalVector(const CounterRng& rng, int64_t count, double scale) {
  std::vector<double> v(static_cast<size_t>(count));
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * rng.Normal(i);
  return v;
}

}  // namespace

absl::StatusOr<std::unique_ptr<TeacherDataSource>> TeacherDataSource::Create(
    const DataSourceOptions& options, Task task) {
  const char* kind = task == Task::kRegression ? "regression" : "classification";
  if (options.input_features <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(kind, " data set: input_features must be > 0, got ", options.input_features));
  }
  const int64_t min_out = task == Task::kRegression ? 1 : 2;
  if (options.output_features < min_out) {
    return absl::InvalidArgumentError(absl::StrCat(kind, " data set: output_features must be >= ",
                                                   min_out, ", got ", options.output_features));
  }
  if (options.global_batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        kind, " data set: global_batch_size must be > 0, got ", options.global_batch_size));
  }
  return std::unique_ptr<TeacherDataSource>(new TeacherDataSource(options, task));
}

TeacherDataSource::TeacherDataSource(const DataSourceOptions& options, Task task)
    : task_(task),
      batch_(options.global_batch_size),
      in_(options.input_features),
      out_(options.output_features),
      inputs_rng_(CounterRng(options.seed).Fork("teacher/inputs")) {
  const CounterRng teacher = CounterRng(options.seed).Fork("teacher/weights");
  const int64_t h = kTeacherHidden;
  // 1/sqrt(fan_in) keeps W1 x ~ N(0, 1); sqrt(2/H) makes up for relu halving
  // the variance, so the targets have about unit scale.
  w1_ = NormalVector(teacher.Fork("w1"), h * in_, 1.0 / std::sqrt(static_cast<double>(in_)));
  b1_ = NormalVector(teacher.Fork("b1"), h, 0.1);
  w2_ = NormalVector(teacher.Fork("w2"), out_ * h, std::sqrt(2.0 / static_cast<double>(h)));
  // Center the outputs: b2 = -mean over kCalibration inputs of a separate stream,
  // so regression targets have mean ~0 and every class wins argmax now and then
  // (without it one class's bias can swallow the rest).
  b2_.assign(static_cast<size_t>(out_), 0.0);
  const CounterRng calibration = teacher.Fork("calibration");
  std::vector<float> x(static_cast<size_t>(in_));
  std::vector<double> y(static_cast<size_t>(out_));
  std::vector<double> mean(static_cast<size_t>(out_), 0.0);
  for (int64_t s = 0; s < kCalibration; ++s) {
    for (size_t j = 0; j < x.size(); ++j) {
      x[j] = static_cast<float>(calibration.Normal(static_cast<uint64_t>(s) * x.size() + j));
    }
    Teacher(x, y);
    for (size_t o = 0; o < y.size(); ++o) mean[o] += y[o];
  }
  for (size_t o = 0; o < mean.size(); ++o) b2_[o] = -mean[o] / static_cast<double>(kCalibration);
}

LossKind TeacherDataSource::loss() const {
  return task_ == Task::kRegression ? LossKind::kMse : LossKind::kCrossEntropy;
}

void TeacherDataSource::Sample(int64_t index, std::span<float> inputs) const {
  // Element j of sample g is draw g*F + j: independent of who asks and when.
  for (size_t j = 0; j < inputs.size(); ++j) {
    const uint64_t n = static_cast<uint64_t>(index) * static_cast<uint64_t>(in_) + j;
    inputs[j] = static_cast<float>(inputs_rng_.Normal(n));
  }
}

void TeacherDataSource::Teacher(std::span<const float> inputs, std::span<double> outputs) const {
  const int64_t h = kTeacherHidden;
  std::vector<double> hidden(static_cast<size_t>(h));
  // hidden = relu(W1 x + b1), [H]
  for (int64_t k = 0; k < h; ++k) {
    double sum = b1_[static_cast<size_t>(k)];
    for (int64_t j = 0; j < in_; ++j) {
      sum += w1_[static_cast<size_t>(k * in_ + j)] * inputs[static_cast<size_t>(j)];
    }
    hidden[static_cast<size_t>(k)] = sum > 0.0 ? sum : 0.0;
  }
  // y = W2 hidden + b2, [O]
  for (int64_t o = 0; o < out_; ++o) {
    double sum = b2_[static_cast<size_t>(o)];
    for (int64_t k = 0; k < h; ++k) {
      sum += w2_[static_cast<size_t>(o * h + k)] * hidden[static_cast<size_t>(k)];
    }
    outputs[static_cast<size_t>(o)] = sum;
  }
}

absl::StatusOr<Batch> TeacherDataSource::GetBatch(int64_t step, int rank, int world_size) {
  ASSIGN_OR_RETURN(const SampleRange range, RankSamples(batch_, step, rank, world_size));
  Batch batch;
  batch.batch_size = range.size();
  batch.seq_len = 1;
  batch.inputs = ZeroMatrix(range.size(), in_);
  if (task_ == Task::kRegression) {
    batch.targets = ZeroMatrix(range.size(), out_);
  } else {
    batch.labels.resize(static_cast<size_t>(range.size()));
  }
  std::vector<double> y(static_cast<size_t>(out_));
  for (int64_t i = 0; i < range.size(); ++i) {
    std::span<float> x(batch.inputs.Row(i), static_cast<size_t>(in_));
    Sample(range.begin + i, x);
    Teacher(x, y);
    if (task_ == Task::kRegression) {
      for (int64_t o = 0; o < out_; ++o) {
        batch.targets.Row(i)[o] = static_cast<float>(y[static_cast<size_t>(o)]);
      }
    } else {
      size_t best = 0;  // argmax; ties go to the lowest class
      for (size_t o = 1; o < y.size(); ++o) best = y[o] > y[best] ? o : best;
      batch.labels[static_cast<size_t>(i)] = static_cast<int32_t>(best);
    }
  }
  return batch;
}

}  // namespace flatshard::compute
