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

absl::Status CausalSelfAttentionLayer::DoForward(const Tensor& in, Tensor& out,
                                                 const RunContext& ctx) {
  const int64_t t = ctx.seq_len;
  if (t <= 0 || in.rows % t != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        Where(), "input has ", in.rows, " rows, not a whole number of sequences of ", t));
  }
  batch_ = in.rows / t;
  seq_ = t;
  RETURN_IF_ERROR(c_attn_->Forward(in, qkv_, ctx));  // [B*T, C] -> [B*T, 3C]
  Tensor y;
  AttentionForward(qkv_, y);             // [B*T, 3C] -> [B*T, C]
  return c_proj_->Forward(y, out, ctx);  // [B*T, C] -> [B*T, C]
}

absl::Status CausalSelfAttentionLayer::DoBackward(const Tensor& dout, Tensor& din,
                                                  const RunContext& ctx) {
  if (qkv_.rows != batch_ * seq_ || dout.rows != qkv_.rows) {
    return absl::FailedPreconditionError(Where() + "backward without a matching forward");
  }
  Tensor dy;
  RETURN_IF_ERROR(c_proj_->Backward(dout, dy, ctx));
  Tensor dqkv;
  AttentionBackward(dy, dqkv);
  qkv_ = Tensor();
  att_.clear();
  return c_attn_->Backward(dqkv, din, ctx);
}

void CausalSelfAttentionLayer::AttentionForward(const Tensor& qkv, Tensor& y) {
  const int64_t B = batch_, T = seq_, C = channels_, H = num_heads_;
  const int64_t hd = C / H;
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  ResizeZero(y, B * T, C);
  att_.assign(static_cast<size_t>(B * H * T * T), 0.0f);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        // q: qkv[b*T+t, h*hd : (h+1)*hd]; k and v sit C and 2C further along.
        const float* q = qkv.Row(b * T + t) + h * hd;
        float* att = att_.data() + ((b * H + h) * T + t) * T;  // att[b, h, t, :]
        // scores[t2] = q . k[t2] * scale for t2 <= t (the causal mask)
        float max_score = -std::numeric_limits<float>::infinity();
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* k = qkv.Row(b * T + t2) + C + h * hd;
          float dot = 0.0f;
          for (int64_t i = 0; i < hd; ++i) dot += q[i] * k[i];
          att[t2] = dot * scale;
          max_score = std::max(max_score, att[t2]);
        }
        // softmax over t2 <= t, shifted by the max for stability
        float sum = 0.0f;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          att[t2] = std::exp(att[t2] - max_score);
          sum += att[t2];
        }
        const float inv_sum = 1.0f / sum;
        for (int64_t t2 = 0; t2 <= t; ++t2) att[t2] *= inv_sum;
        // y[b*T+t, h*hd + i] = sum_t2 att[t2] * v[t2][i]
        float* out = y.Row(b * T + t) + h * hd;
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv.Row(b * T + t2) + 2 * C + h * hd;
          for (int64_t i = 0; i < hd; ++i) out[i] += att[t2] * v[i];
        }
      }
    }
  }
}

void CausalSelfAttentionLayer::AttentionBackward(const Tensor& dy, Tensor& dqkv) const {
  const int64_t B = batch_, T = seq_, C = channels_, H = num_heads_;
  const int64_t hd = C / H;
  const auto scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  ResizeZero(dqkv, B * T, 3 * C);
  std::vector<float> datt(static_cast<size_t>(T));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < H; ++h) {
        const float* att = att_.data() + ((b * H + h) * T + t) * T;
        const float* dout = dy.Row(b * T + t) + h * hd;
        const float* q = qkv_.Row(b * T + t) + h * hd;
        float* dq = dqkv.Row(b * T + t) + h * hd;
        // datt[t2] = dout . v[t2];  dv[t2] += att[t2] * dout
        float weighted = 0.0f;  // sum_t2 att[t2] * datt[t2], for the softmax backward
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float* v = qkv_.Row(b * T + t2) + 2 * C + h * hd;
          float* dv = dqkv.Row(b * T + t2) + 2 * C + h * hd;
          float dot = 0.0f;
          for (int64_t i = 0; i < hd; ++i) {
            dot += dout[i] * v[i];
            dv[i] += att[t2] * dout[i];
          }
          datt[static_cast<size_t>(t2)] = dot;
          weighted += att[t2] * dot;
        }
        // dscore[t2] = att[t2] * (datt[t2] - weighted); score = q . k * scale
        for (int64_t t2 = 0; t2 <= t; ++t2) {
          const float dscore = att[t2] * (datt[static_cast<size_t>(t2)] - weighted) * scale;
          const float* k = qkv_.Row(b * T + t2) + C + h * hd;
          float* dk = dqkv.Row(b * T + t2) + C + h * hd;
          for (int64_t i = 0; i < hd; ++i) {
            dq[i] += dscore * k[i];
            dk[i] += dscore * q[i];
          }
        }
      }
    }
  }
}

}  // namespace flatshard::compute
