// GPT-2's pre-LayerNorm transformer block: x = x + attn(ln_1(x)); then
// x = x + mlp(ln_2(x)). The four children are whatever modules the spec names
// ln_1, attn, ln_2 and mlp; each keeps the width C.
#ifndef FLATSHARD_WORKER_COMPUTE_TRANSFORMER_BLOCK_H_
#define FLATSHARD_WORKER_COMPUTE_TRANSFORMER_BLOCK_H_

#include <memory>

#include "worker/compute/layer.h"

namespace flatshard::compute {

class TransformerBlockLayer : public Layer {
 public:
  TransformerBlockLayer(LayerInfo info, std::unique_ptr<Layer> ln_1, std::unique_ptr<Layer> attn,
                        std::unique_ptr<Layer> ln_2, std::unique_ptr<Layer> mlp);

 protected:
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;

 private:
  std::unique_ptr<Layer> ln_1_;
  std::unique_ptr<Layer> attn_;
  std::unique_ptr<Layer> ln_2_;
  std::unique_ptr<Layer> mlp_;
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_TRANSFORMER_BLOCK_H_
