// A data set read from .npy files in a directory (DataSourceOptions::path):
//   inputs.npy   float32 [N, F] (or [N]: F = 1)   dense inputs, or
//                int32/int64 [N, T]                token ids
//   targets.npy  float32 [N, O] (or [N])          MSE targets, or
//   labels.npy   int32/int64 [N] (dense inputs) or [N, T] (token ids)
// Exactly one of targets.npy and labels.npy. Global batch s holds samples
// (s*B + i) mod N, i < B, so steps cycle through the file in order. Everything
// is loaded into memory when opened; all checks happen there.
#ifndef FLATSHARD_WORKER_COMPUTE_NPY_DATA_SOURCE_H_
#define FLATSHARD_WORKER_COMPUTE_NPY_DATA_SOURCE_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

#include "worker/compute/data_source.h"

namespace flatshard::compute {

class NpyDataSource : public DataSource {
 public:
  // Reads options.path/{inputs,targets,labels}.npy. Shapes that disagree,
  // ids or labels out of range (vocab_size / output_features when > 0),
  // input_features or seq_len that contradict the files are INVALID_ARGUMENT
  // naming the file.
  static absl::StatusOr<std::unique_ptr<NpyDataSource>> Open(const DataSourceOptions& options);

  absl::StatusOr<Batch> GetBatch(int64_t step, int rank, int world_size) override;
  LossKind loss() const override { return loss_; }

  int64_t num_samples() const { return samples_; }

 private:
  NpyDataSource() = default;

  int64_t batch_ = 0;
  int64_t samples_ = 0;  // N
  LossKind loss_ = LossKind::kMse;
  bool tokens_ = false;
  int64_t width_ = 0;            // F (dense) or T (tokens)
  int64_t target_width_ = 0;     // O for MSE; T for token labels; 1 for dense labels
  std::vector<float> inputs_;    // dense [N, F]
  std::vector<int32_t> ids_;     // tokens [N, T]
  std::vector<float> targets_;   // [N, O]
  std::vector<int32_t> labels_;  // [N] or [N, T]
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_NPY_DATA_SOURCE_H_
