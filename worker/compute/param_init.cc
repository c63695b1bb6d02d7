#include "worker/compute/param_init.h"

#include <cmath>

#include "absl/strings/str_cat.h"

#include "worker/compute/rng.h"

namespace flatshard::compute {
namespace {

struct InitRule {
  enum class Kind { kConstant, kNormal, kUniform };
  Kind kind = Kind::kConstant;
  double a = 0.0;  // constant value, normal mean, or uniform low
  double b = 0.0;  // normal std, or uniform high
};

// ParamSpec.init when it says something, else the shape rule (see the header).
InitRule RuleFor(const ParamSpec& param) {
  const ParamInit& init = param.init;
  switch (init.kind) {
    case ParamInit::Kind::kZeros:
      return {InitRule::Kind::kConstant, 0.0, 0.0};
    case ParamInit::Kind::kOnes:
      return {InitRule::Kind::kConstant, 1.0, 0.0};
    case ParamInit::Kind::kNormal:
      return {InitRule::Kind::kNormal, init.mean, init.std};
    case ParamInit::Kind::kUniform:
      return {InitRule::Kind::kUniform, init.low, init.high};
    case ParamInit::Kind::kDefault:
      break;
  }
  if (param.shape.size() >= 2) {
    const int64_t fan_in = NumElements(param.shape) / param.shape[0];
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    return {InitRule::Kind::kUniform, -bound, bound};
  }
  return {InitRule::Kind::kConstant, param.name == "weight" ? 1.0 : 0.0, 0.0};
}

const IndexedParam* Primary(const ModelIndex& index, int param_index) {
  if (param_index < 0 || static_cast<size_t>(param_index) >= index.params.size()) return nullptr;
  const int primary = index.params[static_cast<size_t>(param_index)].primary;
  return &index.params[static_cast<size_t>(primary)];
}

absl::Status NoSuchParam(const ModelIndex& index, int param_index) {
  return absl::InvalidArgumentError(absl::StrCat("InitParam: parameter index ", param_index,
                                                 " is outside [0, ", index.params.size(), ")"));
}

}  // namespace

absl::Status InitParamRange(const ParamSpec& param, const std::string& fqn, uint64_t seed,
                            int64_t begin, std::span<float> out) {
  const int64_t numel = NumElements(param.shape);
  const int64_t end = begin + static_cast<int64_t>(out.size());
  if (begin < 0 || end > numel) {
    return absl::InvalidArgumentError(absl::StrCat("InitParam: elements [", begin, ", ", end,
                                                   ") are outside parameter '", fqn, "' of ", numel,
                                                   " elements"));
  }
  const InitRule rule = RuleFor(param);
  // Element n is draw n of the parameter's own stream: any slice on its own.
  const CounterRng rng = CounterRng(seed).Fork("param").Fork(fqn);
  for (size_t i = 0; i < out.size(); ++i) {
    const uint64_t n = static_cast<uint64_t>(begin) + i;
    double value = rule.a;
    if (rule.kind == InitRule::Kind::kNormal) value = rule.a + rule.b * rng.Normal(n);
    if (rule.kind == InitRule::Kind::kUniform) value = rule.a + (rule.b - rule.a) * rng.Uniform(n);
    out[i] = static_cast<float>(value);
  }
  return absl::OkStatus();
}

absl::Status InitParam(const ParamSpec& param, const std::string& fqn, uint64_t seed,
                       std::span<float> out) {
  const int64_t numel = NumElements(param.shape);
  if (static_cast<int64_t>(out.size()) != numel) {
    return absl::InvalidArgumentError(absl::StrCat("InitParam: parameter '", fqn, "' has ", numel,
                                                   " elements, the output holds ", out.size()));
  }
  return InitParamRange(param, fqn, seed, 0, out);
}

absl::Status InitParamRange(const ModelIndex& index, int param_index, uint64_t seed, int64_t begin,
                            std::span<float> out) {
  const IndexedParam* primary = Primary(index, param_index);
  if (primary == nullptr) return NoSuchParam(index, param_index);
  return InitParamRange(*primary->spec, primary->fqn, seed, begin, out);
}

absl::Status InitParam(const ModelIndex& index, int param_index, uint64_t seed,
                       std::span<float> out) {
  const IndexedParam* primary = Primary(index, param_index);
  if (primary == nullptr) return NoSuchParam(index, param_index);
  return InitParam(*primary->spec, primary->fqn, seed, out);
}

}  // namespace flatshard::compute
