// Teacher-student data sets: inputs x ~ N(0, 1) and a fixed random "teacher"
// MLP, y = W2 relu(W1 x + b1) + b2 (b2 centres y), so a student model can really learn the
// mapping and its loss falls. Regression trains on y with MSE; classification
// on argmax(y) with cross-entropy. Everything derives from the seed through a
// counter-based generator keyed by the global sample index, and the teacher is
// evaluated in double with a fixed summation order, so the bytes are the same
// on every rank, world size and platform.
#ifndef FLATSHARD_WORKER_COMPUTE_TEACHER_DATA_H_
#define FLATSHARD_WORKER_COMPUTE_TEACHER_DATA_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

#include "worker/compute/data_source.h"
#include "worker/compute/rng.h"

namespace flatshard::compute {

class TeacherDataSource : public DataSource {
 public:
  enum class Task { kRegression, kClassification };
  static constexpr int64_t kTeacherHidden = 32;
  static constexpr int64_t kCalibration = 1024;  // samples that centre the teacher's outputs

  // Needs global_batch_size, input_features and output_features > 0
  // (classification: output_features >= 2 classes).
  static absl::StatusOr<std::unique_ptr<TeacherDataSource>> Create(const DataSourceOptions& options,
                                                                   Task task);

  absl::StatusOr<Batch> GetBatch(int64_t step, int rank, int world_size) override;
  LossKind loss() const override;

  // Sample `index` of the data set: its F inputs, and the teacher's O outputs.
  void Sample(int64_t index, std::span<float> inputs) const;
  void Teacher(std::span<const float> inputs, std::span<double> outputs) const;

 private:
  TeacherDataSource(const DataSourceOptions& options, Task task);

  Task task_;
  int64_t batch_;
  int64_t in_;
  int64_t out_;
  CounterRng inputs_rng_;
  std::vector<double> w1_;  // [H, F]
  std::vector<double> b1_;  // [H]
  std::vector<double> w2_;  // [O, H]
  std::vector<double> b2_;  // [O]
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_TEACHER_DATA_H_
