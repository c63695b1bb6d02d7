// Deterministic parameter initialisation: every rank derives the same values
// for a parameter from (seed, FQN) alone, through a counter-based generator, so
// no rank has to broadcast initial weights and a rank can initialise just the
// slice it owns. An explicit ParamSpec.init always wins. Values are float32;
// converting to a parameter's storage dtype is the caller's business.
//
// The default needs nothing but the ParamSpec, so every overload below (and
// DenseParamStore::Init) gives the same values for the same parameter, whoever
// calls which; that keeps FSDP ranks and the single-process reference
// identical. It is PyTorch's where the parameter alone tells the rule:
//   >= 2-D               U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in = numel / shape[0]
//                        (nn.Linear's weight: kaiming_uniform_(a=sqrt(5)))
//   1-D/scalar "weight"  ones (LayerNorm)
//   other 1-D/scalar     zeros (biases)
// Two places differ from PyTorch because they need the module type or a
// sibling's shape, which InitParam(ParamSpec, ...) cannot see: Embedding tables
// get the fan-in uniform rule above instead of N(0, 1) (which, tied to a GPT
// head, would also make the first logits huge), and Linear biases get zeros
// instead of U(-1/sqrt(in), 1/sqrt(in)). Write `init:` in the spec for either.
#ifndef FLATSHARD_WORKER_COMPUTE_PARAM_INIT_H_
#define FLATSHARD_WORKER_COMPUTE_PARAM_INIT_H_

#include <cstdint>
#include <span>
#include <string>

#include "absl/status/status.h"

#include "core/model_spec.h"

namespace flatshard::compute {

// Fills `out` (exactly numel elements) with the values of parameter `fqn`.
// INVALID_ARGUMENT when out.size() != numel.
absl::Status InitParam(const ParamSpec& param, const std::string& fqn, uint64_t seed,
                       std::span<float> out);

// Elements [begin, begin + out.size()) of those values, for a rank that only
// materialises its shard. INVALID_ARGUMENT when the range does not fit.
absl::Status InitParamRange(const ParamSpec& param, const std::string& fqn, uint64_t seed,
                            int64_t begin, std::span<float> out);

// The same for parameter `param_index` of `index`; a tied alias gets its
// primary's values (FSDP stores the pair once), i.e. InitParam(primary spec,
// primary FQN, ...).
absl::Status InitParam(const ModelIndex& index, int param_index, uint64_t seed,
                       std::span<float> out);
absl::Status InitParamRange(const ModelIndex& index, int param_index, uint64_t seed, int64_t begin,
                            std::span<float> out);

}  // namespace flatshard::compute

#endif  // FLATSHARD_WORKER_COMPUTE_PARAM_INIT_H_
