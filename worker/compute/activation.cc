#include "worker/compute/activation.h"

#include <cmath>

namespace flatshard::compute {
namespace {

constexpr float kInvSqrt2 = 0.70710678118654752440f;
constexpr float kInvSqrt2Pi = 0.39894228040143267794f;  // 1/sqrt(2*pi), the N(0,1) density at 0
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluCubic = 0.044715f;

// d/dx of 0.5 x (1 + erf(x / sqrt 2)) = Phi(x) + x phi(x).
float GeluErfGrad(float x) {
  const float cdf = 0.5f * (1.0f + std::erf(x * kInvSqrt2));
  const float pdf = kInvSqrt2Pi * std::exp(-0.5f * x * x);
  return cdf + x * pdf;
}

// d/dx of 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3).
float GeluTanhGrad(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  const float t = std::tanh(u);
  const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * x * x);
  return 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du;
}

}  // namespace

float GeluErf(float x) { return 0.5f * x * (1.0f + std::erf(x * kInvSqrt2)); }

float GeluTanh(float x) {
  const float u = kSqrt2OverPi * (x + kGeluCubic * x * x * x);
  return 0.5f * x * (1.0f + std::tanh(u));
}

absl::Status ReluLayer::DoForward(const Tensor& in, Tensor& out, const RunContext&) {
  // y = max(x, 0), element-wise over [N, C]
  out = in;
  for (float& v : out.values) v = v > 0.0f ? v : 0.0f;
  y_ = out;
  return absl::OkStatus();
}

absl::Status ReluLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext&) {
  if (dout.values.size() != y_.values.size()) {
    return absl::InvalidArgumentError(Where() +
                                      "output gradient does not match the forward output");
  }
  // dx = dy where y > 0 (torch's convention: the gradient at 0 is 0)
  din = dout;
  for (size_t i = 0; i < din.values.size(); ++i) {
    if (!(y_.values[i] > 0.0f)) din.values[i] = 0.0f;
  }
  y_ = Tensor();
  return absl::OkStatus();
}

absl::Status GeluLayer::DoForward(const Tensor& in, Tensor& out, const RunContext&) {
  x_ = in;
  out = in;
  if (approximate_ == Approximation::kTanh) {
    for (float& v : out.values) v = GeluTanh(v);
  } else {
    for (float& v : out.values) v = GeluErf(v);
  }
  return absl::OkStatus();
}

absl::Status GeluLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext&) {
  if (dout.values.size() != x_.values.size()) {
    return absl::InvalidArgumentError(Where() +
                                      "output gradient does not match the forward output");
  }
  // dx = dy * gelu'(x)
  din = dout;
  const bool tanh = approximate_ == Approximation::kTanh;
  for (size_t i = 0; i < din.values.size(); ++i) {
    const float x = x_.values[i];
    din.values[i] *= tanh ? GeluTanhGrad(x) : GeluErfGrad(x);
  }
  x_ = Tensor();
  return absl::OkStatus();
}

absl::Status IdentityLayer::DoForward(const Tensor& in, Tensor& out, const RunContext&) {
  out = in;
  return absl::OkStatus();
}

absl::Status IdentityLayer::DoBackward(const Tensor& dout, Tensor& din, const RunContext&) {
  din = dout;
  return absl::OkStatus();
}

}  // namespace flatshard::compute
