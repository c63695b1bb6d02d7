// Element-wise layers without parameters: ReLU, GELU (torch's exact erf form or
// approximate='tanh'), and Identity, which also stands in for Dropout: flatshard
// trains deterministically, so dropout's p is ignored, as in model.eval().
#ifndef FLATSHARD_WORKER_COMPUTE_ACTIVATION_H_
#define FLATSHARD_WORKER_COMPUTE_ACTIVATION_H_

#include <utility>

#include "worker/compute/layer.h"

namespace flatshard::compute {

class ReluLayer : public Layer {
 public:
  explicit ReluLayer(LayerInfo info) : Layer(std::move(info)) {}

 protected:
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;

 private:
  Tensor y_;  // the output; its sign is the mask
};

class GeluLayer : public Layer {
 public:
  enum class Approximation { kNone, kTanh };
  GeluLayer(LayerInfo info, Approximation approximate)
      : Layer(std::move(info)), approximate_(approximate) {}

 protected:
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;

 private:
  flatshard::Activation activation() const {
    return approximate_ == Approximation::kTanh ? flatshard::Activation::kGeluTanh
                                                : flatshard::Activation::kGeluErf;
  }

  Approximation approximate_;
  Tensor x_;  // the input
};

// Identity and Dropout (p ignored: no randomness in training, see above).
class IdentityLayer : public Layer {
 public:
  explicit IdentityLayer(LayerInfo info) : Layer(std::move(info)) {}

 protected:
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;
};

// The scalar functions, exposed for tests: torch.nn.functional.gelu.
float GeluErf(float x);
float GeluTanh(float x);

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_ACTIVATION_H_
