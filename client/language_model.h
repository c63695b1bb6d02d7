// A trained token model on this machine's CPU, for `flatshard generate` and
// `flatshard eval`: the workers' own layer library (worker/compute) run
// forward only, with the weights of a checkpoint (FULL or SHARDED) or a
// summoned safetensors file. Using the workers' code, not a second
// implementation, means what is evaluated here is what was trained.
#ifndef FLATSHARD_CLIENT_LANGUAGE_MODEL_H_
#define FLATSHARD_CLIENT_LANGUAGE_MODEL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

#include "core/model_spec.h"
#include "worker/compute/dense_param_store.h"
#include "worker/compute/model.h"
#include "worker/device/host/host_device.h"
#include "worker/device/memory_tracker.h"

namespace flatshard {

struct EvalResult {
  double loss = 0;  // mean cross-entropy per token (nats)
  int64_t tokens = 0;
};

struct SamplingOptions {
  int64_t tokens = 200;      // new tokens to generate
  double temperature = 0.8;  // > 0; 1 samples the model's distribution
  int top_k = 0;             // 0: all tokens
  uint64_t seed = 0;
};

class LanguageModel {
 public:
  // A committed checkpoint directory: the model spec from its manifest, the
  // weights from its files (verified as `flatshard ckpt verify` does).
  static absl::StatusOr<std::unique_ptr<LanguageModel>> FromCheckpoint(const std::string& dir);
  // A model spec file and a safetensors file holding every parameter by FQN
  // (`flatshard summon --out`).
  static absl::StatusOr<std::unique_ptr<LanguageModel>> FromFiles(const std::string& model_file,
                                                                  const std::string& weights_file);

  int64_t vocab_size() const { return model_->vocab_size(); }
  // The longest sequence the model takes (the GPT's positions).
  int64_t context_length() const { return context_length_; }

  // Mean loss over the windows of `data_dir`/{inputs,labels}.npy (the layout
  // `flatshard data prepare-text` writes), `batch` windows per forward.
  absl::StatusOr<EvalResult> Evaluate(const std::string& data_dir, int64_t batch = 8);

  // `prompt` (at least one token) continued by sampling; returns the new tokens.
  absl::StatusOr<std::vector<int32_t>> Generate(const std::vector<int32_t>& prompt,
                                                const SamplingOptions& options);

 private:
  LanguageModel() = default;
  static absl::StatusOr<std::unique_ptr<LanguageModel>> Create(
      std::unique_ptr<ModelSpec> spec,
      const std::function<absl::StatusOr<std::vector<float>>(const IndexedParam&)>& read);
  // Logits [ids.size() / seq_len * seq_len, vocab] of `batch` sequences.
  absl::StatusOr<std::vector<float>> Forward(const std::vector<int32_t>& ids,
                                             const std::vector<int32_t>& labels, int64_t samples,
                                             int64_t seq_len, double* loss);

  std::shared_ptr<HostDevice> device_;
  std::unique_ptr<Stream> stream_;
  MemoryTracker memory_;
  std::unique_ptr<ModelSpec> spec_;  // heap-held: index_ points into it
  ModelIndex index_;
  std::unique_ptr<compute::Model> model_;
  std::unique_ptr<compute::DenseParamStore> params_;
  int64_t context_length_ = 0;
};

}  // namespace flatshard

#endif  // FLATSHARD_CLIENT_LANGUAGE_MODEL_H_
