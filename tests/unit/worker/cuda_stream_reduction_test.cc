// The CUDA device against the CPU device for the operations that reduce:
// LayerNorm, the causal softmax, the losses, EmbeddingBackward, the optimizer
// steps and clip_grad_norm_ (docs/fsdp-semantics.md §8). Row statistics and
// whole-tensor sums are compared within 1e-5 relative (the GPU sums in another
// order); column sums and EmbeddingBackward sum in the host's order and must
// match bit for bit, as must the elementwise optimizer updates.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <gtest/gtest.h>

#include "tests/unit/worker/cuda_stream_test_util.h"

namespace flatshard::cuda::testing {
namespace {

class CudaStreamReductionTest : public CudaStreamTest {
 protected:
  std::vector<float> Squares(size_t count) {
    std::vector<float> values = Normal(count, 0.01f);
    for (float& v : values) v *= v;
    return values;
  }
};

TEST_F(CudaStreamReductionTest, LayerNormMatches) {
  const size_t rows = 150;  // three blocks of column sums, the last one partial
  for (const int64_t dim : {int64_t{7}, int64_t{300}, int64_t{1029}}) {
    for (const bool affine : {true, false}) {
      SCOPED_TRACE(absl::StrCat("dim ", dim, affine ? ", affine" : ", plain"));
      const auto d = static_cast<size_t>(dim);
      std::vector<float> x_values = Normal(rows * d, 2.0f);
      for (float& v : x_values) v += 5.0f;  // a mean far from 0 tests the centring
      Both<float> x = Upload(x_values);
      Both<float> weight = Upload(affine ? Normal(d) : std::vector<float>());
      Both<float> bias = Upload(affine ? Normal(d) : std::vector<float>());
      Both<float> y = Poisoned<float>(rows * d), xhat = Poisoned<float>(rows * d);
      Both<float> rstd = Poisoned<float>(rows);
      Both<float> dy = Upload(Normal(rows * d)), dx = Poisoned<float>(rows * d);
      Both<float> weight_grad = Upload(affine ? Normal(d) : std::vector<float>());
      Both<float> bias_grad = Upload(affine ? Normal(d) : std::vector<float>());
      OnBoth([&](Stream& s, Side side) {
        return s.LayerNormForward(x.on(side), dim, weight.on(side), bias.on(side), 1e-5, y.on(side),
                                  xhat.on(side), rstd.on(side));
      });
      ExpectClose(y, "y");
      ExpectClose(xhat, "xhat");
      ExpectClose(rstd, "rstd");
      // The backward gets the same saved tensors on both devices (the host's),
      // so its column sums can be compared bit for bit.
      const std::vector<float> saved_xhat = HostValues(xhat), saved_rstd = HostValues(rstd);
      Both<float> xhat_in = Upload(saved_xhat), rstd_in = Upload(saved_rstd);
      OnBoth([&](Stream& s, Side side) {
        return s.LayerNormBackward(dy.on(side), xhat_in.on(side), rstd_in.on(side), weight.on(side),
                                   dx.on(side), weight_grad.on(side), bias_grad.on(side));
      });
      ExpectClose(dx, "dx");
      ExpectBitEqual(weight_grad, "weight grad");
      ExpectBitEqual(bias_grad, "bias grad");
    }
  }
}

TEST_F(CudaStreamReductionTest, CausalSoftmaxMatches) {
  for (const int64_t seq : {int64_t{1}, int64_t{13}, int64_t{300}}) {
    SCOPED_TRACE(absl::StrCat("seq ", seq));
    const size_t matrices = 6, count = matrices * static_cast<size_t>(seq * seq);
    const float scale = 0.125f;
    Both<float> scores = Upload(Normal(count, 8.0f)), probs = Poisoned<float>(count);
    OnBoth([&](Stream& s, Side side) {
      return s.CausalSoftmaxForward(scores.on(side), seq, scale, probs.on(side));
    });
    ExpectClose(probs, "probs");
    Both<float> probs_in = Upload(HostValues(probs));
    Both<float> dprobs = Upload(Normal(count)), dscores = Poisoned<float>(count);
    OnBoth([&](Stream& s, Side side) {
      return s.CausalSoftmaxBackward(probs_in.on(side), dprobs.on(side), seq, scale,
                                     dscores.on(side));
    });
    ExpectClose(dscores, "dscores");
  }
}

TEST_F(CudaStreamReductionTest, MseLossMatches) {
  for (const size_t count : {size_t{1}, size_t{1000}, size_t{300001}}) {
    SCOPED_TRACE(absl::StrCat(count, " elements"));
    Both<float> out = Upload(Normal(count)), target = Upload(Normal(count));
    Both<float> grad = Poisoned<float>(count);
    Both<double> loss = Poisoned<double>(1);
    OnBoth([&](Stream& s, Side side) {
      return s.MseLoss(out.on(side), target.on(side), grad.on(side), loss.on(side));
    });
    ExpectBitEqual(grad, "grad");
    ExpectClose(loss, "loss");
  }
}

TEST_F(CudaStreamReductionTest, CrossEntropyLossMatches) {
  for (const int64_t classes : {int64_t{1}, int64_t{10}, int64_t{5003}}) {
    SCOPED_TRACE(absl::StrCat(classes, " classes"));
    const size_t rows = 45, count = rows * static_cast<size_t>(classes);
    Both<float> logits = Upload(Normal(count, 4.0f));
    Both<int32_t> labels = Upload(Ints(rows, static_cast<int32_t>(classes)));
    Both<float> grad = Poisoned<float>(count);
    Both<double> loss = Poisoned<double>(1);
    OnBoth([&](Stream& s, Side side) {
      return s.CrossEntropyLoss(logits.on(side), classes, labels.on(side), grad.on(side),
                                loss.on(side));
    });
    ExpectClose(grad, "grad");
    ExpectClose(loss, "loss");
  }
}

TEST_F(CudaStreamReductionTest, EmbeddingBackwardSumsInRowOrder) {
  const int64_t vocab = 40, dim = 33;
  const size_t tokens = 2000;  // many repeats of every id
  Both<int32_t> ids = Upload(Ints(tokens, static_cast<int32_t>(vocab)));
  Both<float> dout = Upload(Normal(tokens * dim)), table_grad = Upload(Normal(vocab * dim));
  OnBoth([&](Stream& s, Side side) {
    return s.EmbeddingBackward(ids.on(side), dout.on(side), dim, table_grad.on(side));
  });
  ExpectBitEqual(table_grad, "table grad");
}

TEST_F(CudaStreamReductionTest, OptimizerStepsMatchBitForBit) {
  const size_t count = 10007;
  for (const bool nesterov : {false, true}) {
    for (const bool first : {true, false}) {
      SCOPED_TRACE(absl::StrCat("sgd nesterov ", nesterov, " first ", first));
      SgdCoefficients c{.maximize = nesterov,
                        .weight_decay = true,
                        .weight_decay_value = 0.01f,
                        .momentum = true,
                        .first_momentum_step = first,
                        .nesterov = nesterov,
                        .momentum_value = 0.9f,
                        .one_minus_dampening = 0.75f,
                        .neg_lr = -0.1f};
      Both<float> params = Upload(Normal(count)), grads = Upload(Normal(count));
      Both<float> momentum = Upload(Normal(count));
      OnBoth([&](Stream& s, Side side) {
        return s.SgdStep(c, params.on(side), grads.on(side), momentum.on(side));
      });
      ExpectBitEqual(params, "params");
      ExpectBitEqual(momentum, "momentum");
    }
  }
  Both<float> plain = Upload(Normal(count)), plain_grads = Upload(Normal(count));
  OnBoth([&](Stream& s, Side side) {
    return s.SgdStep(SgdCoefficients{.neg_lr = -0.5f}, plain.on(side), plain_grads.on(side), {});
  });
  ExpectBitEqual(plain, "sgd without momentum");

  for (const bool amsgrad : {false, true}) {
    for (const bool decoupled : {false, true}) {
      SCOPED_TRACE(absl::StrCat("adam amsgrad ", amsgrad, " decoupled ", decoupled));
      AdamCoefficients c{.maximize = amsgrad,
                         .decoupled = decoupled,
                         .l2 = !decoupled,
                         .amsgrad = amsgrad,
                         .decay_factor = 0.999f,
                         .weight_decay = 0.01f,
                         .lerp_weight = 0.1f,
                         .beta2 = 0.999f,
                         .one_minus_beta2 = 0.001f,
                         .bias_correction2_sqrt = 0.0447f,
                         .eps = 1e-8f,
                         .neg_step_size = -0.01f};
      Both<float> params = Upload(Normal(count)), grads = Upload(Normal(count));
      // Second moments are squares: non-negative.
      Both<float> exp_avg = Upload(Normal(count)), exp_avg_sq = Upload(Squares(count));
      Both<float> max_sq = Upload(amsgrad ? Squares(count) : std::vector<float>());
      OnBoth([&](Stream& s, Side side) {
        return s.AdamStep(c, params.on(side), grads.on(side), exp_avg.on(side), exp_avg_sq.on(side),
                          max_sq.on(side));
      });
      ExpectBitEqual(params, "params");
      ExpectBitEqual(exp_avg, "exp_avg");
      ExpectBitEqual(exp_avg_sq, "exp_avg_sq");
      ExpectBitEqual(max_sq, "max_exp_avg_sq");
    }
  }
}

TEST_F(CudaStreamReductionTest, GradNormAndClipMatch) {
  const double inf = std::numeric_limits<double>::infinity();
  const size_t sizes[] = {1, 777, 0, 123457};
  for (const double p : {2.0, 1.0, 3.0, inf}) {
    SCOPED_TRACE(absl::StrCat("norm_type ", p));
    std::vector<Both<float>> grads;
    grads.reserve(std::size(sizes));
    for (size_t size : sizes) grads.push_back(Upload(Normal(size, 0.01f)));
    Both<double> contribution = Poisoned<double>(1);
    OnBoth([&](Stream& s, Side side) {
      std::vector<DeviceSpan<const float>> spans;
      spans.reserve(grads.size());
      for (const Both<float>& g : grads) spans.emplace_back(g.on(side));
      return s.GradNormContribution(spans, p, contribution.on(side));
    });
    ExpectClose(contribution, "contribution");
    // Clip with the host's contribution on both devices, as after an all-reduce.
    Both<double> reduced = Upload(HostValues(contribution));
    OnBoth([&](Stream& s, Side side) {
      std::vector<DeviceSpan<float>> spans;
      spans.reserve(grads.size());
      for (const Both<float>& g : grads) spans.emplace_back(g.on(side));
      return s.ClipGrads(spans, reduced.on(side), p, 0.1);
    });
    for (const Both<float>& g : grads) ExpectBitEqual(g, "clipped grads");
  }
  // No tensors: a zero contribution.
  Both<double> empty = Poisoned<double>(1);
  OnBoth([&](Stream& s, Side side) { return s.GradNormContribution({}, 2.0, empty.on(side)); });
  ExpectBitEqual(empty, "no tensors");
}

}  // namespace
}  // namespace flatshard::cuda::testing
