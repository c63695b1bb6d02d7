// The module types a ModelSpec may use, what parameters each may own, and the
// shorthand settings (`in_features: 128`) that expand into PyTorch's parameters.
// The worker's layer library implements the same names.
#ifndef FLATSHARD_CORE_MODULE_TYPES_H_
#define FLATSHARD_CORE_MODULE_TYPES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/model_spec.h"

namespace flatshard {

enum class ModuleKind {
  kContainer,   // runs its children; may own extra parameters of any shape
  kActivation,  // no parameters, no children (ReLU, GELU, ...)
  kLinear,      // weight [out, in], optional bias [out]
  kLayerNorm,   // optional weight [d] and bias [d]
  kEmbedding,   // weight [num, dim]
  kAttention,   // MultiheadAttention: in_proj_* params plus an out_proj child
};

struct ModuleTypeInfo {
  absl::string_view name;
  ModuleKind kind;
  // Keys a spec may give instead of explicit params, e.g. Linear's in_features.
  std::vector<absl::string_view> shorthand_keys;
};

// nullptr when `name` is not a known type.
const ModuleTypeInfo* FindModuleType(absl::string_view name);

// "Linear, LayerNorm, ..." for error messages.
std::string KnownModuleTypeList();

// Settings from a spec's shorthand keys. Integers and booleans only.
using ShorthandSettings = std::map<std::string, int64_t>;

// Fills `module.params` (and, for MultiheadAttention, its out_proj child) from
// shorthand settings. Errors name the key and the problem.
absl::Status ExpandShorthand(const ModuleTypeInfo& type, const ShorthandSettings& settings,
                             DType dtype, ModuleSpec& module);

// Checks that a module's parameters and children fit its type (e.g. a Linear's
// weight is 2-D and its bias matches the output size). The message names the
// parameter and the problem but not the module; the caller adds that.
absl::Status CheckModuleAgainstType(const ModuleSpec& module, const ModuleTypeInfo& type);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_MODULE_TYPES_H_
