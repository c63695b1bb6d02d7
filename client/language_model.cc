#include "client/language_model.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"

#include "core/model_spec_proto.h"
#include "core/model_spec_yaml.h"
#include "core/status_macros.h"
#include "storage/checkpoint_reader.h"
#include "storage/safetensors_reader.h"
#include "storage/spec_files.h"
#include "worker/compute/module_hooks.h"
#include "worker/compute/npy.h"

namespace flatshard {
namespace {

// The GPT's positions (its wpe rows); 0 when the model has none.
int64_t ContextLength(const ModelIndex& index) {
  auto it = index.param_by_fqn.find("wpe.weight");
  if (it == index.param_by_fqn.end()) return 0;
  return index.params[static_cast<size_t>(it->second)].spec->shape.front();
}

absl::StatusOr<std::vector<int32_t>> ReadIds(const std::string& path, int64_t* samples,
                                             int64_t* seq_len) {
  ASSIGN_OR_RETURN(compute::NpyArray array, compute::ReadNpyFile(path));
  if (array.shape.size() != 2 || array.shape[0] <= 0 || array.shape[1] <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": expected token ids of shape [samples, seq_len]"));
  }
  *samples = array.shape[0];
  *seq_len = array.shape[1];
  std::vector<int32_t> ids(static_cast<size_t>(*samples * *seq_len));
  for (size_t i = 0; i < ids.size(); ++i) {
    if (array.dtype == DType::kInt32) {
      ids[i] = reinterpret_cast<const int32_t*>(array.data.data())[i];
    } else if (array.dtype == DType::kInt64) {
      ids[i] = static_cast<int32_t>(reinterpret_cast<const int64_t*>(array.data.data())[i]);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(path, ": token ids must be int32 or int64"));
    }
  }
  return ids;
}

}  // namespace

absl::StatusOr<std::unique_ptr<LanguageModel>> LanguageModel::Create(
    std::unique_ptr<ModelSpec> spec,
    const std::function<absl::StatusOr<std::vector<float>>(const IndexedParam&)>& read) {
  std::unique_ptr<LanguageModel> lm(new LanguageModel());
  lm->spec_ = std::move(spec);
  ASSIGN_OR_RETURN(lm->index_, IndexModel(*lm->spec_));
  lm->device_ = std::make_shared<HostDevice>();
  ASSIGN_OR_RETURN(lm->stream_, lm->device_->CreateStream(StreamRole::kCompute, "generate"));
  ASSIGN_OR_RETURN(lm->model_,
                   compute::Model::Create(*lm->spec_, lm->index_, compute::LossKind::kCrossEntropy,
                                          {lm->device_.get(), lm->stream_.get(), &lm->memory_}));
  if (!lm->model_->takes_token_ids()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", lm->spec_->name, "' does not take token ids: not a language model"));
  }
  lm->params_ = std::make_unique<compute::DenseParamStore>(lm->index_);
  for (size_t p = 0; p < lm->index_.params.size(); ++p) {
    const IndexedParam& param = lm->index_.params[p];
    if (param.primary != static_cast<int>(p)) continue;  // a tied alias: its primary's storage
    ASSIGN_OR_RETURN(std::vector<float> values, read(param));
    std::span<float> dst = lm->params_->values(static_cast<int>(p));
    if (values.size() != dst.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "parameter '", param.fqn, "' has ", values.size(), " values, the model ", dst.size()));
    }
    std::copy(values.begin(), values.end(), dst.begin());
  }
  lm->context_length_ = ContextLength(lm->index_);
  return lm;
}

absl::StatusOr<std::unique_ptr<LanguageModel>> LanguageModel::FromCheckpoint(
    const std::string& dir) {
  ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(dir));
  if (reader->manifest().state_dict_type == v1::LOCAL_STATE_DICT) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir,
                     " is a LOCAL_STATE_DICT (flat shards of one layout): convert it with "
                     "`flatshard ckpt consolidate ",
                     dir, " -o OUT` and use OUT"));
  }
  ASSIGN_OR_RETURN(ModelSpec spec, ModelSpecFromProto(reader->manifest().job_spec.model()));
  CheckpointReader* raw = reader.get();
  return Create(std::make_unique<ModelSpec>(std::move(spec)), [raw](const IndexedParam& p) {
    return raw->ReadFull("model", p.fqn, p.spec->shape);
  });
}

absl::StatusOr<std::unique_ptr<LanguageModel>> LanguageModel::FromFiles(
    const std::string& model_file, const std::string& weights_file) {
  ASSIGN_OR_RETURN(ModelSpec spec, LoadModelSpecFile(model_file));
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsReader> weights,
                   SafetensorsReader::Open(weights_file));
  SafetensorsReader* raw = weights.get();
  return Create(std::make_unique<ModelSpec>(std::move(spec)),
                [raw](const IndexedParam& p) -> absl::StatusOr<std::vector<float>> {
                  ASSIGN_OR_RETURN(const SafetensorsEntry* entry, raw->Find(p.fqn));
                  if (entry->shape != p.spec->shape) {
                    return absl::InvalidArgumentError(absl::StrCat(
                        raw->path(), ": '", p.fqn, "' has another shape than the model spec says"));
                  }
                  return raw->ReadFloats(p.fqn, 0,
                                         static_cast<uint64_t>(NumElements(p.spec->shape)));
                });
}

absl::StatusOr<std::vector<float>> LanguageModel::Forward(const std::vector<int32_t>& ids,
                                                          const std::vector<int32_t>& labels,
                                                          int64_t samples, int64_t seq_len,
                                                          double* loss) {
  compute::Batch batch;
  batch.batch_size = samples;
  batch.seq_len = seq_len;
  batch.ids = ids;
  batch.labels = labels;
  compute::NoopModuleHooks hooks;
  ASSIGN_OR_RETURN(double value, model_->ForwardLoss(batch, *params_, hooks));
  if (loss != nullptr) *loss = value;
  return model_->OutputToHost();
}

absl::StatusOr<EvalResult> LanguageModel::Evaluate(const std::string& data_dir, int64_t batch) {
  int64_t samples = 0, seq_len = 0, label_samples = 0, label_len = 0;
  ASSIGN_OR_RETURN(std::vector<int32_t> inputs,
                   ReadIds(absl::StrCat(data_dir, "/inputs.npy"), &samples, &seq_len));
  ASSIGN_OR_RETURN(std::vector<int32_t> labels,
                   ReadIds(absl::StrCat(data_dir, "/labels.npy"), &label_samples, &label_len));
  if (label_samples != samples || label_len != seq_len) {
    return absl::InvalidArgumentError(
        absl::StrCat(data_dir, ": labels.npy and inputs.npy have different shapes"));
  }
  if (context_length_ > 0 && seq_len > context_length_) {
    return absl::InvalidArgumentError(absl::StrCat(data_dir, ": windows of ", seq_len,
                                                   " tokens exceed the model's ", context_length_,
                                                   " positions"));
  }
  for (int32_t id : inputs) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(data_dir, "/inputs.npy: token id ", id,
                                                     " outside the model's vocabulary of ",
                                                     vocab_size()));
    }
  }
  EvalResult result;
  double weighted = 0;
  for (int64_t first = 0; first < samples; first += batch) {
    const int64_t n = std::min(batch, samples - first);
    const auto begin = static_cast<size_t>(first * seq_len);
    const auto end = static_cast<size_t>((first + n) * seq_len);
    std::vector<int32_t> ids(inputs.begin() + static_cast<std::ptrdiff_t>(begin),
                             inputs.begin() + static_cast<std::ptrdiff_t>(end));
    std::vector<int32_t> targets(labels.begin() + static_cast<std::ptrdiff_t>(begin),
                                 labels.begin() + static_cast<std::ptrdiff_t>(end));
    double loss = 0;
    RETURN_IF_ERROR(Forward(ids, targets, n, seq_len, &loss).status());
    weighted += loss * static_cast<double>(n * seq_len);
    result.tokens += n * seq_len;
  }
  result.loss = weighted / static_cast<double>(result.tokens);
  return result;
}

absl::StatusOr<std::vector<int32_t>> LanguageModel::Generate(const std::vector<int32_t>& prompt,
                                                             const SamplingOptions& options) {
  if (prompt.empty()) return absl::InvalidArgumentError("--prompt must not be empty");
  if (!(options.temperature > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--temperature must be > 0, got ", options.temperature));
  }
  for (int32_t id : prompt) {
    if (id < 0 || id >= vocab_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prompt token ", id, " is outside the model's vocabulary of ", vocab_size()));
    }
  }
  std::mt19937_64 rng(options.seed);
  std::vector<int32_t> context = prompt;
  std::vector<int32_t> generated;
  const auto vocab = static_cast<size_t>(vocab_size());
  for (int64_t n = 0; n < options.tokens; ++n) {
    const size_t window = context_length_ > 0
                              ? std::min(context.size(), static_cast<size_t>(context_length_))
                              : context.size();
    std::vector<int32_t> ids(context.end() - static_cast<std::ptrdiff_t>(window), context.end());
    const std::vector<int32_t> no_labels(ids.size(), 0);
    ASSIGN_OR_RETURN(std::vector<float> logits,
                     Forward(ids, no_labels, 1, static_cast<int64_t>(ids.size()), nullptr));
    // The last position's distribution, softened by the temperature.
    std::vector<double> p(vocab);
    const float* last = logits.data() + (ids.size() - 1) * vocab;
    const double top = *std::max_element(last, last + vocab);
    for (size_t v = 0; v < vocab; ++v) {
      p[v] = std::exp((static_cast<double>(last[v]) - top) / options.temperature);
    }
    if (options.top_k > 0 && static_cast<size_t>(options.top_k) < vocab) {
      std::vector<double> sorted = p;
      std::nth_element(sorted.begin(), sorted.begin() + options.top_k - 1, sorted.end(),
                       std::greater<>());
      const double kth = sorted[static_cast<size_t>(options.top_k - 1)];
      for (double& x : p) x = x < kth ? 0 : x;
    }
    std::discrete_distribution<int32_t> pick(p.begin(), p.end());
    const int32_t next = pick(rng);
    context.push_back(next);
    generated.push_back(next);
  }
  return generated;
}

}  // namespace flatshard
