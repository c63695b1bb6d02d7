// The GPT-2 model body: x = wte(ids) + wpe(0..T-1); x = h(x) (the blocks);
// logits = lm_head(ln_f(x)). The children are found by name; lm_head.weight may
// be tied to wte.weight, in which case the resolver hands both the same storage
// and both uses accumulate into one grad.
#ifndef FLATSHARD_WORKER_COMPUTE_GPT_H_
#define FLATSHARD_WORKER_COMPUTE_GPT_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/compute/embedding.h"
#include "worker/compute/layer.h"

namespace flatshard::compute {

class GptLayer : public Layer {
 public:
  GptLayer(LayerInfo info, std::unique_ptr<EmbeddingLayer> wte, std::unique_ptr<EmbeddingLayer> wpe,
           std::unique_ptr<Layer> h, std::unique_ptr<Layer> ln_f, std::unique_ptr<Layer> lm_head);

 protected:
  // Reads the token ids [B*T] from ctx.ids and T from ctx.seq_len; `in` is ignored.
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  // Leaves `din` empty: the input is token ids.
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;

 private:
  std::unique_ptr<EmbeddingLayer> wte_;
  std::unique_ptr<EmbeddingLayer> wpe_;
  std::unique_ptr<Layer> h_;
  std::unique_ptr<Layer> ln_f_;
  std::unique_ptr<Layer> lm_head_;
  std::vector<int32_t> positions_;  // 0..T-1, wpe's ids
  int64_t seq_ = 0;                 // T of the last forward
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_GPT_H_
