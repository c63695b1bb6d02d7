// The host's row reductions: the causal softmax and the cross-entropy loss
// (worker/device/host/host_softmax_kernels.h) against double-precision
// references, their vector copies (libmvec) against the portable ones, and the
// interleaved row sums they and LayerNorm use (interleaved_sum.h).
#include "worker/device/host/host_softmax_kernels.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

#include "worker/device/host/interleaved_sum.h"

namespace flatshard::host_kernels {
namespace {

std::vector<float> Normal(size_t count, float stddev, unsigned seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, stddev);
  std::vector<float> values(count);
  for (float& v : values) v = normal(rng);
  return values;
}

std::vector<HostIsa> Copies() {
  std::vector<HostIsa> copies = {HostIsa::kPortable};
  if (HostIsaSupported(HostIsa::kAvx2Fma)) copies.push_back(HostIsa::kAvx2Fma);
  return copies;
}

TEST(InterleavedSumTest, SumsEveryElementOnceWhateverTheTail) {
  for (const size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{129}}) {
    std::vector<int> visits(n, 0);
    const uint64_t sum = InterleavedSum<uint64_t>(n, [&visits](size_t i) {
      ++visits[i];
      return uint64_t{i + 1};
    });
    EXPECT_EQ(sum, n * (n + 1) / 2) << n << " elements";
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(visits[i], 1) << "element " << i << " of " << n;
  }
}

TEST(InterleavedSumTest, DoubleSumOfFloatsIsExactSoTheOrderDoesNotShow) {
  // LayerNorm's mean: floats spanning 20 binades sum exactly in double, so
  // the interleaved order gives the sequential sum's bits.
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> mantissa(-1.0f, 1.0f);
  std::uniform_int_distribution<int> binade(-10, 10);
  for (const size_t n : {size_t{5}, size_t{128}, size_t{1029}}) {
    std::vector<float> x(n);
    for (float& v : x) v = std::ldexp(mantissa(rng), binade(rng));
    double sequential = 0.0;
    for (const float v : x) sequential += v;
    const double interleaved = InterleavedSum<double>(n, [&x](size_t i) { return double{x[i]}; });
    EXPECT_EQ(interleaved, sequential) << n << " elements";
  }
}

TEST(HostSoftmaxKernelsTest, CausalSoftmaxMatchesADoubleReference) {
  for (const HostIsa isa : Copies()) {
    for (const size_t seq : {size_t{1}, size_t{13}, size_t{64}, size_t{300}}) {
      SCOPED_TRACE(absl::StrCat("seq ", seq, isa == HostIsa::kPortable ? ", portable" : ", avx2"));
      const size_t matrices = 3;
      std::vector<float> scores = Normal(matrices * seq * seq, 8.0f, 11);
      // A masked score (-inf) in the last row of matrix 1, beside finite ones.
      const size_t masked = seq * seq + (seq - 1) * seq;
      if (seq > 1) scores[masked] = -std::numeric_limits<float>::infinity();
      const float scale = 0.125f;
      std::vector<float> probs(scores.size(), std::nanf(""));
      CausalSoftmaxForward(scores.data(), matrices, seq, scale, probs.data(), isa);
      for (size_t row = 0; row < matrices * seq; ++row) {
        const size_t t = row % seq;
        const float* s = scores.data() + row * seq;
        const float* p = probs.data() + row * seq;
        double max = -std::numeric_limits<double>::infinity();
        for (size_t i = 0; i <= t; ++i) max = std::max(max, double{s[i] * scale});
        double sum = 0.0;
        for (size_t i = 0; i <= t; ++i) sum += std::exp(double{s[i] * scale} - max);
        for (size_t i = 0; i <= t; ++i) {
          const double expected = std::exp(double{s[i] * scale} - max) / sum;
          // float exp arguments and float sums: a few e-7 relative
          ASSERT_NEAR(p[i], expected, 2e-6 * expected + 1e-12) << "row " << row << " col " << i;
        }
        for (size_t i = t + 1; i < seq; ++i) ASSERT_EQ(p[i], 0.0f) << "row " << row << " col " << i;
      }
      if (seq > 1) {
        EXPECT_EQ(probs[masked], 0.0f);  // exp(-inf) is an exact 0
      }
    }
  }
}

TEST(HostSoftmaxKernelsTest, TheMaxComesFromEveryLaneAndTheTail) {
  // A score of 1000 overflows exp unless the max took it: in the tail of a
  // 13-wide row (index 12) and in a middle lane (index 3) of another.
  for (const HostIsa isa : Copies()) {
    const size_t seq = 13;
    std::vector<float> scores = Normal(seq * seq, 1.0f, 2);
    scores[(seq - 1) * seq + 12] = 1000.0f;
    scores[(seq - 2) * seq + 3] = 1000.0f;
    std::vector<float> probs(scores.size());
    CausalSoftmaxForward(scores.data(), 1, seq, 1.0f, probs.data(), isa);
    for (size_t i = 0; i < seq; ++i) {
      EXPECT_EQ(probs[(seq - 1) * seq + i], i == 12 ? 1.0f : 0.0f) << i;
      EXPECT_EQ(probs[(seq - 2) * seq + i], i == 3 ? 1.0f : 0.0f) << i;
    }
    std::vector<float> logits = Normal(2 * seq, 1.0f, 3);
    logits[12] = 1000.0f;             // row 0: its tail
    logits[seq + 3] = 1000.0f;        // row 1: a middle lane
    logits[seq + 5] = std::nanf("");  // and a NaN that is not first: skipped by the max
    const std::vector<int32_t> labels = {12, 3};
    std::vector<float> grad(logits.size());
    double loss = -1.0;
    CrossEntropyLoss(logits.data(), 1, seq, labels.data(), grad.data(), &loss, isa);
    EXPECT_EQ(loss, 0.0);  // log(1 + e^-1000...) - 0
    CrossEntropyLoss(logits.data() + seq, 1, seq, labels.data() + 1, grad.data(), &loss, isa);
    EXPECT_TRUE(std::isnan(loss));  // the NaN's own exp makes the row's sum NaN
    EXPECT_FALSE(std::isinf(loss));
  }
}

TEST(HostSoftmaxKernelsTest, CausalSoftmaxBackwardMatchesADoubleReference) {
  const size_t matrices = 2, seq = 67;
  std::vector<float> scores = Normal(matrices * seq * seq, 2.0f, 5);
  std::vector<float> probs(scores.size()), dscores(scores.size(), std::nanf(""));
  CausalSoftmaxForward(scores.data(), matrices, seq, 0.5f, probs.data());
  const std::vector<float> dprobs = Normal(scores.size(), 1.0f, 6);
  CausalSoftmaxBackward(probs.data(), dprobs.data(), matrices, seq, 0.5f, dscores.data());
  for (size_t row = 0; row < matrices * seq; ++row) {
    const size_t t = row % seq;
    const float* p = probs.data() + row * seq;
    const float* dp = dprobs.data() + row * seq;
    double weighted = 0.0;
    for (size_t i = 0; i <= t; ++i) weighted += double{p[i]} * dp[i];
    for (size_t i = 0; i <= t; ++i) {
      const double expected = double{p[i]} * (dp[i] - weighted) * 0.5;
      ASSERT_NEAR(dscores[row * seq + i], expected, 1e-6 * (1.0 + std::fabs(expected)))
          << "row " << row << " col " << i;
    }
    for (size_t i = t + 1; i < seq; ++i) ASSERT_EQ(dscores[row * seq + i], 0.0f);
  }
}

TEST(HostSoftmaxKernelsTest, VectorCausalSoftmaxStaysWithinAFewUlpOfThePortableOne) {
  if (!HostIsaSupported(HostIsa::kAvx2Fma)) GTEST_SKIP() << "this CPU has no AVX2 + FMA";
  const size_t matrices = 8, seq = 64;
  const std::vector<float> scores = Normal(matrices * seq * seq, 4.0f, 9);
  std::vector<float> p0(scores.size()), p1(scores.size());
  CausalSoftmaxForward(scores.data(), matrices, seq, 0.25f, p0.data(), HostIsa::kPortable);
  CausalSoftmaxForward(scores.data(), matrices, seq, 0.25f, p1.data(), HostIsa::kAvx2Fma);
  // On and below the diagonal, rows of two or more (a row of one is exactly
  // 1): libmvec's expf is within an ulp or two of glibc's, and the row's
  // normaliser adds a few more (about half the elements come out identical).
  for (size_t i = 0; i < scores.size(); ++i) {
    const size_t t = (i / seq) % seq, t2 = i % seq;
    if (t2 > t || t == 0) continue;
    ASSERT_NEAR(p0[i], p1[i], 1e-6f * p0[i]) << "element " << i;  // ~8 ulp
  }
}

TEST(HostSoftmaxKernelsTest, CrossEntropyMatchesADoubleReference) {
  for (const HostIsa isa : Copies()) {
    // 1029 classes: two whole tiles of exponentials and a partial one.
    for (const size_t classes : {size_t{1}, size_t{7}, size_t{256}, size_t{1029}}) {
      SCOPED_TRACE(
          absl::StrCat(classes, " classes", isa == HostIsa::kPortable ? ", portable" : ", avx2"));
      const size_t rows = 5;
      const auto n_rows = static_cast<double>(rows);
      const std::vector<float> logits = Normal(rows * classes, 3.0f, 21);
      std::vector<int32_t> labels(rows);
      for (size_t r = 0; r < rows; ++r) labels[r] = static_cast<int32_t>((r * 37) % classes);
      std::vector<float> grad(logits.size(), std::nanf(""));
      double loss = std::nan("");
      CrossEntropyLoss(logits.data(), rows, classes, labels.data(), grad.data(), &loss, isa);
      double expected_loss = 0.0;
      for (size_t r = 0; r < rows; ++r) {
        const float* z = logits.data() + r * classes;
        double max = z[0];
        for (size_t k = 0; k < classes; ++k) max = std::max(max, double{z[k]});
        double sum = 0.0;
        for (size_t k = 0; k < classes; ++k) sum += std::exp(z[k] - max);
        expected_loss += std::log(sum) - (z[labels[r]] - max);
        for (size_t k = 0; k < classes; ++k) {
          const double p = std::exp(z[k] - max) / sum;
          const double expected = (p - (k == static_cast<size_t>(labels[r]) ? 1.0 : 0.0)) / n_rows;
          ASSERT_NEAR(grad[r * classes + k], expected, 3e-7 * std::max(std::fabs(expected), 1e-4))
              << "row " << r << " class " << k;
        }
      }
      EXPECT_NEAR(loss, expected_loss / n_rows, 1e-12 * std::max(1.0, expected_loss / n_rows));
    }
  }
}

TEST(HostSoftmaxKernelsTest, CrossEntropyOfANaNRowIsNaNAndOthersAreNot) {
  for (const HostIsa isa : Copies()) {
    const size_t rows = 2, classes = 9;
    std::vector<float> logits = Normal(rows * classes, 1.0f, 4);
    logits[0] = std::nanf("");  // row 0 starts with NaN
    const std::vector<int32_t> labels = {3, 4};
    std::vector<float> grad(logits.size());
    double loss = 0.0;
    CrossEntropyLoss(logits.data(), 1, classes, labels.data(), grad.data(), &loss, isa);
    EXPECT_TRUE(std::isnan(loss));
    CrossEntropyLoss(logits.data() + classes, 1, classes, labels.data() + 1, grad.data(), &loss,
                     isa);
    EXPECT_TRUE(std::isfinite(loss));
    for (size_t k = 0; k < classes; ++k) EXPECT_TRUE(std::isfinite(grad[k])) << k;
  }
}

}  // namespace
}  // namespace flatshard::host_kernels
