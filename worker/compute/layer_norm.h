// torch.nn.LayerNorm over the last dimension: y = (x - mean) / sqrt(var + eps)
// * weight + bias, with the biased variance; weight and bias are optional
// (elementwise_affine: false, bias: false).
#ifndef FLATSHARD_WORKER_COMPUTE_LAYER_NORM_H_
#define FLATSHARD_WORKER_COMPUTE_LAYER_NORM_H_

#include <cstdint>
#include <vector>

#include "worker/compute/layer.h"

namespace flatshard::compute {

class LayerNormLayer : public Layer {
 public:
  static constexpr double kDefaultEps = 1e-5;  // torch's default

  // `dim` is the normalized size; 0 means "the input's width" (a LayerNorm
  // without weight has no parameter to fix it).
  LayerNormLayer(LayerInfo info, LayerParam weight, LayerParam bias, int64_t dim, double eps);

 protected:
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;

 private:
  LayerParam weight_;
  LayerParam bias_;
  int64_t dim_;  // 0: any width
  double eps_;
  Tensor xhat_;  // (x - mean) * rstd, [N, dim]
  Tensor rstd_;  // 1 / sqrt(var + eps), [N, 1]
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_LAYER_NORM_H_
