// torch.nn.Embedding: row i of the output is row ids[i] of weight [num, dim].
// Its input is token ids (RunContext::ids), never a float tensor, so it is the
// model's first compute module or one of GPT's wte/wpe.
#ifndef FLATSHARD_WORKER_COMPUTE_EMBEDDING_H_
#define FLATSHARD_WORKER_COMPUTE_EMBEDDING_H_

#include <cstdint>
#include <vector>

#include "worker/compute/layer.h"

namespace flatshard::compute {

class EmbeddingLayer : public Layer {
 public:
  EmbeddingLayer(LayerInfo info, LayerParam weight, int64_t num_embeddings, int64_t dim);

  int64_t num_embeddings() const { return num_; }
  int64_t dim() const { return dim_; }

 protected:
  // Reads ctx.ids; `in` is ignored. Ids outside [0, num) are INVALID_ARGUMENT.
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  // Scatter-adds `dout` rows into the weight grad; `din` is left empty.
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;

 private:
  LayerParam weight_;
  int64_t num_;
  int64_t dim_;
  DeviceBuffer ids_;  // the forward ids (int32), for the scatter in backward
  size_t num_ids_ = 0;
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_EMBEDDING_H_
