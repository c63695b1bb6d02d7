// GPT-2's CausalSelfAttention: qkv = c_attn(x) [N, 3C], split into q, k, v and
// into num_heads heads of C / num_heads; each position attends to itself and
// earlier positions of its own sample with softmax(q k^T / sqrt(head_dim));
// the heads are concatenated and projected by c_proj. Rows are [batch, seq_len]
// flattened, with seq_len from RunContext.
#ifndef FLATSHARD_WORKER_COMPUTE_CAUSAL_SELF_ATTENTION_H_
#define FLATSHARD_WORKER_COMPUTE_CAUSAL_SELF_ATTENTION_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/compute/layer.h"
#include "worker/compute/linear.h"

namespace flatshard::compute {

class CausalSelfAttentionLayer : public Layer {
 public:
  // c_attn is [3C, in] and c_proj [out, C] (GPT-2: in = out = C); C % num_heads
  // == 0. The builder checks these.
  CausalSelfAttentionLayer(LayerInfo info, std::unique_ptr<LinearLayer> c_attn,
                           std::unique_ptr<LinearLayer> c_proj, int64_t num_heads);

 protected:
  absl::Status DoForward(const Tensor& in, Tensor& out, const RunContext& ctx) override;
  absl::Status DoBackward(const Tensor& dout, Tensor& din, const RunContext& ctx) override;

 private:
  // The parameter-free middle: qkv [B*T, 3C] -> y [B*T, C]; keeps q_, k_, v_, att_.
  absl::Status AttentionForward(const RunContext& ctx, const Tensor& qkv, Tensor& y);
  // dy [B*T, C] -> dqkv [B*T, 3C], from q_, k_, v_ and att_.
  absl::Status AttentionBackward(const RunContext& ctx, const Tensor& dy, Tensor& dqkv) const;
  // q, k or v's heads inside qkv [B*T, 3C] (part 0, 1, 2), or y's inside [B*T, C].
  HeadLayout Heads(int64_t row_stride, int64_t part) const;

  std::unique_ptr<LinearLayer> c_attn_;
  std::unique_ptr<LinearLayer> c_proj_;
  int64_t channels_;   // C, the width of q, k and v
  int64_t num_heads_;  // H
  int64_t batch_ = 0;  // B of the last forward
  int64_t seq_ = 0;    // T of the last forward
  Tensor q_, k_, v_;   // [B, H, T, head_dim] each
  Tensor att_;         // softmax probabilities [B*H*T, T], zero above the diagonal
};

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_CAUSAL_SELF_ATTENTION_H_
