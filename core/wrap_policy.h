// Wrap policies and the FSDP units they cut a model into (docs/fsdp-semantics.md §9.1). Units
// come out in module pre-order (the root first); each owns the parameters of its
// subtree that no nested unit took, in FSDP's flatten order.
#ifndef FLATSHARD_CORE_WRAP_POLICY_H_
#define FLATSHARD_CORE_WRAP_POLICY_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

#include "core/model_spec.h"

namespace flatshard {

struct WrapPolicy {
  enum class Kind {
    kNone,          // only the root unit
    kModuleType,    // ModuleWrapPolicy: every module of the listed types
    kSizeBased,     // size_based_auto_wrap_policy through _recursive_wrap
    kExplicitFqns,  // the listed modules
    kAlways,        // always_wrap_policy: every module (empty ones dropped)
  };
  Kind kind = Kind::kNone;
  std::set<std::string> module_types;
  int64_t min_num_params = 100000000;  // PyTorch's default, int(1e8)
  std::set<std::string> force_leaf_module_types = {"MultiheadAttention"};
  std::set<std::string> exclude_module_types = {"ModuleList", "ModuleDict"};
  std::vector<std::string> module_fqns;
};

// Parses the CLI form: "none", "always", "module-type:A[,B...]",
// "size:MIN_NUM_PARAMS" (1e6 and 1_000_000 both accepted), "fqn:a.b[,c.d...]".
absl::StatusOr<WrapPolicy> ParseWrapPolicy(absl::string_view text);

// The CLI form back (for plans and logs).
std::string WrapPolicyToString(const WrapPolicy& policy);

struct UnitParam {
  std::string fqn;      // full FQN from the model root
  int param_index = 0;  // into ModelIndex::params
  std::vector<int64_t> shape;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  bool requires_grad = true;
};

// A tied parameter stored once in its unit: `fqn` is a view of `primary_fqn`.
struct SharedParam {
  std::string fqn;
  std::string primary_fqn;
};

struct Unit {
  int index = 0;
  std::string module_fqn;  // "" for the root
  std::string module_type;
  int module_index = 0;  // into ModelIndex::modules
  bool is_root = false;
  std::vector<UnitParam> params;  // primaries, flatten order
  std::vector<SharedParam> shared;
  int64_t numel = 0;  // sum of the primaries' numels (no padding)
};

// Cuts the model into units. Errors: a policy naming unknown module types or
// FQNs, min_num_params <= 0, tied parameters split across units.
absl::StatusOr<std::vector<Unit>> ComputeUnits(const ModelIndex& index, const WrapPolicy& policy);

// "unit 3 (layers.2)" / "unit 0 (root)" for messages.
std::string UnitLabel(const Unit& unit);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_WRAP_POLICY_H_
