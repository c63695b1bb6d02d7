// torch.nn.Linear: y = x W^T + b with weight [out, in] and an optional bias
// [out]. Forward and backward are GEMMs on the device (OpenBLAS on the CPU,
// cuBLAS on a GPU) plus a bias kernel each.
#ifndef FLATSHARD_WORKER_COMPUTE_LINEAR_H_
#define FLATSHARD_WORKER_COMPUTE_LINEAR_H_

#include <cstdint>

#include "worker/compute/layer.h"

namespace flatshard::compute {

class LinearLayer : public Layer {
 public:
  // `bias` may be absent (bias: false).
  LinearLayer(LayerInfo info, LayerParam weight, LayerParam bias, int64_t in_features,
              int64_t out_features);

  int64_t in_features() const { return in_; }
  int64_t out_features() const { return out_; }

 protected:
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;

 private:
  LayerParam weight_;
  LayerParam bias_;
  int64_t in_;
  int64_t out_;
  Tensor x_;  // the forward input [N, in], for dW
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_LINEAR_H_
