// Where a worker's training batches come from. A DataSource is deterministic:
// sample i of global batch s is the same bytes whatever the world size, so
// training with W ranks sees exactly the data one rank would, and each rank
// derives its slice without talking to the others. Implementations live in
// teacher_data.h (regression, classification), token_data.h and
// npy_data_source.h; MakeDataSource picks one.
#ifndef FLATSHARD_WORKER_COMPUTE_DATA_SOURCE_H_
#define FLATSHARD_WORKER_COMPUTE_DATA_SOURCE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "worker/compute/batch.h"
#include "worker/compute/loss.h"

namespace flatshard::compute {

class DataSource {
 public:
  virtual ~DataSource() = default;
  // The slice of global batch `step` that `rank` of `world_size` trains on:
  // samples [rank*B/W, (rank+1)*B/W) of the global batch, whose samples are
  // step*B .. step*B + B-1 of the data set. B % W != 0, a rank outside
  // [0, W) or a negative step is INVALID_ARGUMENT.
  virtual absl::StatusOr<Batch> GetBatch(int64_t step, int rank, int world_size) = 0;
  // The loss the targets are meant for: kMse with Batch::targets,
  // kCrossEntropy with Batch::labels.
  virtual LossKind loss() const = 0;
};

enum class DataKind {
  kRegression,      // inputs ~ N(0, 1), targets = a fixed random teacher MLP (MSE)
  kClassification,  // inputs ~ N(0, 1), labels = argmax of the teacher (cross-entropy)
  kTokens,          // a noisy fixed permutation chain of token ids (next-token CE)
  kNpy,             // .npy files in a directory (see npy_data_source.h)
};

// "regression", "classification", "tokens", "npy".
absl::StatusOr<DataKind> ParseDataKind(absl::string_view name);
absl::string_view DataKindName(DataKind kind);

struct DataSourceOptions {
  DataKind kind = DataKind::kRegression;
  int64_t global_batch_size = 0;  // B: samples per step over all ranks; > 0
  int64_t seq_len = 1;            // T: tokens per sample (tokens; npy token files must agree)
  uint64_t seed = 0;              // synthetic data sets: everything derives from it
  int64_t input_features = 0;     // regression / classification: F (npy: checked when > 0)
  int64_t output_features = 0;    // regression: target width; classification: classes
  int64_t vocab_size = 0;         // tokens: V >= 2 (npy token files: ids checked when > 0)
  std::string path;               // npy: the directory holding the files
};

// Validates the options for their kind; errors name the option.
absl::StatusOr<std::unique_ptr<DataSource>> MakeDataSource(const DataSourceOptions& options);

// Global sample indices [begin, end) of `rank`'s slice of batch `step`.
struct SampleRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
absl::StatusOr<SampleRange> RankSamples(int64_t global_batch_size, int64_t step, int rank,
                                        int world_size);

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_DATA_SOURCE_H_
