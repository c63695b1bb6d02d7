#include "worker/compute/token_data.h"

#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard::compute {

absl::StatusOr<std::unique_ptr<TokenDataSource>> TokenDataSource::Create(
    const DataSourceOptions& options) {
  if (options.vocab_size < 2 || options.vocab_size > std::numeric_limits<int32_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens data set: vocab_size must be in [2, 2^31), got ", options.vocab_size));
  }
  if (options.seq_len <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tokens data set: seq_len must be > 0, got ", options.seq_len));
  }
  if (options.global_batch_size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tokens data set: global_batch_size must be > 0, got ", options.global_batch_size));
  }
  return std::unique_ptr<TokenDataSource>(new TokenDataSource(options));
}

TokenDataSource::TokenDataSource(const DataSourceOptions& options)
    : batch_(options.global_batch_size),
      seq_(options.seq_len),
      vocab_(options.vocab_size),
      rng_(CounterRng(options.seed).Fork("tokens")) {
  // Fisher-Yates with draws keyed by position: the same permutation everywhere.
  perm_.resize(static_cast<size_t>(vocab_));
  for (size_t i = 0; i < perm_.size(); ++i) perm_[i] = static_cast<int32_t>(i);
  const CounterRng shuffle = rng_.Fork("permutation");
  for (size_t i = perm_.size() - 1; i > 0; --i) {
    std::swap(perm_[i], perm_[shuffle.Below(i, i + 1)]);
  }
}

void TokenDataSource::Sequence(int64_t index, std::span<int32_t> tokens) const {
  const CounterRng sample = rng_.Fork(static_cast<uint64_t>(index));
  const auto v = static_cast<uint64_t>(vocab_);
  tokens[0] = static_cast<int32_t>(sample.Below(0, v));
  for (size_t t = 1; t < tokens.size(); ++t) {
    // Draw 2t decides noise, draw 2t+1 is the random token.
    const bool noise = sample.Uniform(2 * t) < kNoise;
    tokens[t] = noise ? static_cast<int32_t>(sample.Below(2 * t + 1, v))
                      : perm_[static_cast<size_t>(tokens[t - 1])];
  }
}

absl::StatusOr<Batch> TokenDataSource::GetBatch(int64_t step, int rank, int world_size) {
  ASSIGN_OR_RETURN(const SampleRange range, RankSamples(batch_, step, rank, world_size));
  Batch batch;
  batch.batch_size = range.size();
  batch.seq_len = seq_;
  const auto t = static_cast<size_t>(seq_);
  batch.ids.resize(static_cast<size_t>(range.size()) * t);
  batch.labels.resize(batch.ids.size());
  std::vector<int32_t> tokens(t + 1);
  for (int64_t i = 0; i < range.size(); ++i) {
    Sequence(range.begin + i, tokens);
    const size_t row = static_cast<size_t>(i) * t;
    for (size_t k = 0; k < t; ++k) {
      batch.ids[row + k] = tokens[k];
      batch.labels[row + k] = tokens[k + 1];
    }
  }
  return batch;
}

}  // namespace flatshard::compute
