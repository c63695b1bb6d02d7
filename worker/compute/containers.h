// Modules that only compose their children: Sequential, ModuleList, MLP and
// Module run their children in order (an empty one is the identity, like an
// empty nn.Sequential); Residual adds its input to that result.
#ifndef FLATSHARD_WORKER_COMPUTE_CONTAINERS_H_
#define FLATSHARD_WORKER_COMPUTE_CONTAINERS_H_

#include <memory>
#include <string>
#include <vector>

#include "worker/compute/layer.h"

namespace flatshard::compute {

// y = children[k-1](... children[0](x)).
class SequentialLayer : public Layer {
 public:
  SequentialLayer(LayerInfo info, std::vector<std::unique_ptr<Layer>> children);

 protected:
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;

 private:
  std::vector<std::unique_ptr<Layer>> children_;
};

// y = x + children[k-1](... children[0](x)).
class ResidualLayer : public Layer {
 public:
  ResidualLayer(LayerInfo info, std::vector<std::unique_ptr<Layer>> children);

 protected:
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;

 private:
  std::vector<std::unique_ptr<Layer>> children_;
};

// The chain both share, also used by TransformerBlock and GPT: forward runs the
// layers in order, backward in reverse (each layer's hooks fire inside).
absl::Status ChainForward(const std::vector<std::unique_ptr<Layer>>& layers, const Tensor& in,
                          Tensor& out, const RunContext& ctx);
absl::Status ChainBackward(const std::vector<std::unique_ptr<Layer>>& layers, const Tensor& dout,
                           Tensor& din, const RunContext& ctx);

// a += b, element-wise; INVALID_ARGUMENT naming `where` when the shapes differ.
absl::Status AddInPlace(Tensor& a, const Tensor& b, const std::string& where,
                        const RunContext& ctx);

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_CONTAINERS_H_
