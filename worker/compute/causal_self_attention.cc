#include "worker/compute/causal_self_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard::compute {

CausalSelfAttentionLayer::CausalSelfAttentionLayer(LayerInfo info,
                                                   std::unique_ptr<LinearLayer> c_attn,
                                                   std::unique_ptr<LinearLayer> c_proj,
                                                   int64_t num_heads)
    : Layer(std::move(info)),
      c_attn_(std::move(c_attn)),
      c_proj_(std::move(c_proj)),
      channels_(c_attn_->out_features() / 3),
      num_heads_(num_heads) {}

HeadLayout CausalSelfAttentionLayer::Heads(int64_t row_stride, int64_t part) const {
  HeadLayout layout;
  layout.batch = batch_;
  layout.seq = seq_;
  layout.heads = num_heads_;
  layout.head_dim = channels_ / num_heads_;
  layout.row_stride = row_stride;
  layout.col_offset = part * channels_;
  return layout;
}

absl::Status CausalSelfAttentionLayer::DoForward(const Tensor& in, Tensor& out,
                                                 const RunContext& ctx) {
  const int64_t t = ctx.seq_len;
  if (t <= 0 || in.rows % t != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), "input has ", in.rows, " rows, not a whole number of sequences of ", t));
  }
  batch_ = in.rows / t;
  seq_ = t;
  Tensor qkv;
  RETURN_IF_ERROR(c_attn_->Forward(in, qkv, ctx));  // [B*T, C] -> [B*T, 3C]
  Tensor y;
  RETURN_IF_ERROR(AttentionForward(ctx, qkv, y));  // [B*T, 3C] -> [B*T, C]
  return c_proj_->Forward(y, out, ctx);            // [B*T, C] -> [B*T, C]
}

absl::Status CausalSelfAttentionLayer::DoBackward(const Tensor& dout, Tensor& din,
                                                  const RunContext& ctx) {
  if (att_.empty() || dout.rows != batch_ * seq_) {
    return absl::FailedPreconditionError(Where() + "backward without a matching forward");
  }
  Tensor dy;
  RETURN_IF_ERROR(c_proj_->Backward(dout, dy, ctx));
  Tensor dqkv;
  RETURN_IF_ERROR(AttentionBackward(ctx, dy, dqkv));
  q_ = Tensor();
  k_ = Tensor();
  v_ = Tensor();
  att_ = Tensor();
  return c_attn_->Backward(dqkv, din, ctx);
}

absl::Status CausalSelfAttentionLayer::AttentionForward(const RunContext& ctx, const Tensor& qkv,
                                                        Tensor& y) {
  const int64_t B = batch_, T = seq_, C = channels_, H = num_heads_;
  const int64_t hd = C / H;
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  Stream& stream = ctx.stream();
  // q, k, v [B, H, T, hd] from their columns of qkv
  ASSIGN_OR_RETURN(q_, NewTensor(ctx.device, B * H * T, hd));
  ASSIGN_OR_RETURN(k_, NewTensor(ctx.device, B * H * T, hd));
  ASSIGN_OR_RETURN(v_, NewTensor(ctx.device, B * H * T, hd));
  RETURN_IF_ERROR(stream.SplitHeads(qkv.span(), Heads(3 * C, 0), q_.span()));
  RETURN_IF_ERROR(stream.SplitHeads(qkv.span(), Heads(3 * C, 1), k_.span()));
  RETURN_IF_ERROR(stream.SplitHeads(qkv.span(), Heads(3 * C, 2), v_.span()));
  // scores[b, h] = q[b, h] k[b, h]^T  [T, T], for all B*H pairs
  ASSIGN_OR_RETURN(Tensor scores, NewTensor(ctx.device, B * H * T, T));
  GemmArgs qk;
  qk.trans_b = true;
  qk.m = T, qk.n = T, qk.k = hd;
  qk.a = q_.span(), qk.lda = hd, qk.stride_a = T * hd;
  qk.b = k_.span(), qk.ldb = hd, qk.stride_b = T * hd;
  qk.c = scores.span(), qk.ldc = T, qk.stride_c = T * T;
  qk.batch = B * H;
  RETURN_IF_ERROR(stream.Gemm(qk));
  // att = softmax over t2 <= t of scores * scale (the causal mask), 0 above
  ASSIGN_OR_RETURN(att_, NewTensor(ctx.device, B * H * T, T));
  RETURN_IF_ERROR(stream.CausalSoftmaxForward(scores.span(), T, scale, att_.span()));
  // y[b, h] = att[b, h] v[b, h]  [T, hd]
  ASSIGN_OR_RETURN(Tensor heads, NewTensor(ctx.device, B * H * T, hd));
  GemmArgs av;
  av.m = T, av.n = hd, av.k = T;
  av.a = att_.span(), av.lda = T, av.stride_a = T * T;
  av.b = v_.span(), av.ldb = hd, av.stride_b = T * hd;
  av.c = heads.span(), av.ldc = hd, av.stride_c = T * hd;
  av.batch = B * H;
  RETURN_IF_ERROR(stream.Gemm(av));
  // y [B*T, C]: the heads side by side
  ASSIGN_OR_RETURN(y, NewTensor(ctx.device, B * T, C));
  return stream.MergeHeads(heads.span(), Heads(C, 0), y.span());
}

absl::Status CausalSelfAttentionLayer::AttentionBackward(const RunContext& ctx, const Tensor& dy,
                                                         Tensor& dqkv) const {
  const int64_t B = batch_, T = seq_, C = channels_, H = num_heads_;
  const int64_t hd = C / H;
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  Stream& stream = ctx.stream();
  const int64_t pairs = B * H;
  // dy's heads [B, H, T, hd]
  ASSIGN_OR_RETURN(Tensor dheads, NewTensor(ctx.device, pairs * T, hd));
  RETURN_IF_ERROR(stream.SplitHeads(dy.span(), Heads(C, 0), dheads.span()));
  // datt = dy_h v^T [T, T]
  ASSIGN_OR_RETURN(Tensor datt, NewTensor(ctx.device, pairs * T, T));
  GemmArgs g1;
  g1.trans_b = true;
  g1.m = T, g1.n = T, g1.k = hd;
  g1.a = dheads.span(), g1.lda = hd, g1.stride_a = T * hd;
  g1.b = v_.span(), g1.ldb = hd, g1.stride_b = T * hd;
  g1.c = datt.span(), g1.ldc = T, g1.stride_c = T * T;
  g1.batch = pairs;
  RETURN_IF_ERROR(stream.Gemm(g1));
  // dv = att^T dy_h [T, hd]
  ASSIGN_OR_RETURN(Tensor dv, NewTensor(ctx.device, pairs * T, hd));
  GemmArgs g2;
  g2.trans_a = true;
  g2.m = T, g2.n = hd, g2.k = T;
  g2.a = att_.span(), g2.lda = T, g2.stride_a = T * T;
  g2.b = dheads.span(), g2.ldb = hd, g2.stride_b = T * hd;
  g2.c = dv.span(), g2.ldc = hd, g2.stride_c = T * hd;
  g2.batch = pairs;
  RETURN_IF_ERROR(stream.Gemm(g2));
  // dscores = att * (datt - sum(att * datt)) * scale, row by row
  ASSIGN_OR_RETURN(Tensor dscores, NewTensor(ctx.device, pairs * T, T));
  RETURN_IF_ERROR(stream.CausalSoftmaxBackward(att_.span(), datt.span(), T, scale, dscores.span()));
  // dq = dscores k, dk = dscores^T q  [T, hd]
  ASSIGN_OR_RETURN(Tensor dq, NewTensor(ctx.device, pairs * T, hd));
  GemmArgs g3;
  g3.m = T, g3.n = hd, g3.k = T;
  g3.a = dscores.span(), g3.lda = T, g3.stride_a = T * T;
  g3.b = k_.span(), g3.ldb = hd, g3.stride_b = T * hd;
  g3.c = dq.span(), g3.ldc = hd, g3.stride_c = T * hd;
  g3.batch = pairs;
  RETURN_IF_ERROR(stream.Gemm(g3));
  ASSIGN_OR_RETURN(Tensor dk, NewTensor(ctx.device, pairs * T, hd));
  GemmArgs g4 = g3;
  g4.trans_a = true;
  g4.b = q_.span();
  g4.c = dk.span();
  RETURN_IF_ERROR(stream.Gemm(g4));
  // dqkv [B*T, 3C] = [dq | dk | dv] in the heads' columns
  ASSIGN_OR_RETURN(dqkv, NewTensor(ctx.device, B * T, 3 * C));
  RETURN_IF_ERROR(stream.MergeHeads(dq.span(), Heads(3 * C, 0), dqkv.span()));
  RETURN_IF_ERROR(stream.MergeHeads(dk.span(), Heads(3 * C, 1), dqkv.span()));
  return stream.MergeHeads(dv.span(), Heads(3 * C, 2), dqkv.span());
}

}  // namespace flatshard::compute
