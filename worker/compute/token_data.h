// A synthetic language for token models: each sequence starts at a random
// token, and every next token is perm[previous] for a fixed random permutation
// of the vocabulary, except that with probability kNoise it is a uniformly
// random token instead. A model that learns the permutation drives the
// next-token loss from ln(V) towards the noise floor (about
// 0.1 * ln(V) + 0.33 nats), so loss curves are meaningful. Batches hold ids
// [B*T] and next-token labels [B*T]; sample g is a pure function of (seed, g).
#ifndef FLATSHARD_WORKER_COMPUTE_TOKEN_DATA_H_
#define FLATSHARD_WORKER_COMPUTE_TOKEN_DATA_H_

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/statusor.h"

#include "worker/compute/data_source.h"
#include "worker/compute/rng.h"

namespace flatshard::compute {

class TokenDataSource : public DataSource {
 public:
  static constexpr double kNoise = 0.1;

  // Needs global_batch_size > 0, seq_len > 0 and vocab_size >= 2 (and < 2^31).
  static absl::StatusOr<std::unique_ptr<TokenDataSource>> Create(const DataSourceOptions& options);

  absl::StatusOr<Batch> GetBatch(int64_t step, int rank, int world_size) override;
  LossKind loss() const override { return LossKind::kCrossEntropy; }

  // The T + 1 tokens of sample `index`: ids are tokens[0..T), labels tokens[1..T].
  void Sequence(int64_t index, std::span<int32_t> tokens) const;
  const std::vector<int32_t>& permutation() const { return perm_; }

 private:
  explicit TokenDataSource(const DataSourceOptions& options);

  int64_t batch_;
  int64_t seq_;
  int64_t vocab_;
  CounterRng rng_;
  std::vector<int32_t> perm_;  // the rule: next = perm_[previous]
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_TOKEN_DATA_H_
