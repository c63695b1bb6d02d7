#include "tests/integration/reference_trainer.h"

#include "core/clip_grad_norm.h"
#include "core/status_macros.h"

namespace flatshard::testing {

absl::StatusOr<std::unique_ptr<ReferenceTrainer>> ReferenceTrainer::Create(
    const ModelSpec& spec, const RuntimeOptions& options) {
  ASSIGN_OR_RETURN(ModelIndex index, IndexModel(spec));
  std::unique_ptr<ReferenceTrainer> trainer(new ReferenceTrainer(std::move(index), options));
  RETURN_IF_ERROR(trainer->store_.Init(trainer->index_, options.seed));
  ASSIGN_OR_RETURN(trainer->stream_,
                   trainer->device_.CreateStream(StreamRole::kCompute, "reference"));
  ASSIGN_OR_RETURN(trainer->model_,
                   compute::Model::Create(spec, trainer->index_, options.loss,
                                          {&trainer->device_, trainer->stream_.get(), nullptr}));
  for (size_t p = 0; p < trainer->index_.params.size(); ++p) {
    const size_t n = trainer->store_.values(static_cast<int>(p)).size();
    trainer->states_.push_back(MakeOptimizerState(options.optimizer.kind, n));
  }
  return trainer;
}

absl::StatusOr<double> ReferenceTrainer::Step(const std::vector<compute::Batch>& batches) {
  store_.ZeroGrads();
  double loss = 0;
  for (const compute::Batch& batch : batches) {
    ASSIGN_OR_RETURN(double l, model_->ForwardLoss(batch, store_, *this));
    RETURN_IF_ERROR(model_->Backward(store_, *this));
    loss += l / static_cast<double>(batches.size());
  }
  std::vector<int> primaries;
  for (size_t p = 0; p < index_.params.size(); ++p) {
    const int pi = static_cast<int>(p);
    if (index_.params[p].primary == pi && store_.trainable(pi)) primaries.push_back(pi);
  }
  const OptimizerSettings& optimizer = options_.optimizer;
  if (optimizer.max_grad_norm > 0) {
    std::vector<std::span<const float>> grads;
    grads.reserve(primaries.size());
    for (int p : primaries) grads.emplace_back(store_.grads(p));
    const double norm_type = optimizer.grad_norm_type;
    const double local =
        IsInfNorm(norm_type) ? LocalGradNormInf(grads) : LocalGradNormPow(grads, norm_type);
    last_grad_norm_ = TotalNormFromReduced(local, 0.0, norm_type);
    const double coef = ClipCoefficient(optimizer.max_grad_norm, last_grad_norm_);
    for (int p : primaries) ScaleGrads(store_.grads(p), coef);
  }
  for (int p : primaries) {
    RETURN_IF_ERROR(OptimizerStep(optimizer, store_.values(p), store_.grads(p),
                                  *states_[static_cast<size_t>(p)]));
  }
  return loss;
}

std::map<std::string, std::vector<float>> ReferenceTrainer::Params() const {
  std::map<std::string, std::vector<float>> out;
  auto& store = const_cast<compute::DenseParamStore&>(store_);
  for (size_t p = 0; p < index_.params.size(); ++p) {
    std::span<float> v = store.values(static_cast<int>(p));
    out[index_.params[p].fqn].assign(v.begin(), v.end());
  }
  return out;
}

std::map<std::string, std::vector<float>> ReferenceTrainer::Grads() const {
  std::map<std::string, std::vector<float>> out;
  auto& store = const_cast<compute::DenseParamStore&>(store_);
  for (size_t p = 0; p < index_.params.size(); ++p) {
    if (!store.trainable(static_cast<int>(p))) continue;
    std::span<float> g = store.grads(static_cast<int>(p));
    out[index_.params[p].fqn].assign(g.begin(), g.end());
  }
  return out;
}

}  // namespace flatshard::testing
