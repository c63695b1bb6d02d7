#include "core/wrap_policy.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"

#include "core/module_types.h"

namespace flatshard {
namespace {

absl::Status CheckPolicyAgainstModel(const ModelIndex& index, const WrapPolicy& policy) {
  for (const std::string& type : policy.module_types) {
    if (FindModuleType(type) == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("wrap_policy.module_types: unknown module type '", type,
                       "'; known types: ", KnownModuleTypeList()));
    }
  }
  if (policy.kind == WrapPolicy::Kind::kModuleType && policy.module_types.empty()) {
    return absl::InvalidArgumentError("wrap_policy.module_types: list at least one module type");
  }
  if (policy.kind == WrapPolicy::Kind::kSizeBased && policy.min_num_params <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("wrap_policy.min_num_params must be > 0, got ", policy.min_num_params));
  }
  if (policy.kind == WrapPolicy::Kind::kExplicitFqns) {
    if (policy.module_fqns.empty()) {
      return absl::InvalidArgumentError("wrap_policy.module_fqns: list at least one module FQN");
    }
    for (const std::string& fqn : policy.module_fqns) {
      if (!index.module_by_fqn.contains(fqn)) {
        return absl::InvalidArgumentError(
            absl::StrCat("wrap_policy.module_fqns: '", fqn, "' is not a module of the model"));
      }
    }
  }
  return absl::OkStatus();
}

// _recursive_wrap (docs/fsdp-semantics.md §9.1) with size_based_auto_wrap_policy.
class SizeBasedWrapper {
 public:
  SizeBasedWrapper(const ModelIndex& index, const WrapPolicy& policy, std::vector<bool>& wrapped)
      : index_(index), policy_(policy), wrapped_(wrapped) {}

  int64_t Wrap(int module, bool only_wrap_children) {
    const IndexedModule& m = index_.modules[static_cast<size_t>(module)];
    const int64_t nonwrapped_numel = index_.SubtreeNumel(module);
    const bool is_large = nonwrapped_numel >= policy_.min_num_params;
    if (!(is_large && !policy_.force_leaf_module_types.contains(m.type))) return 0;
    int64_t total_wrapped_numel = 0;
    for (int child : m.children) total_wrapped_numel += Wrap(child, false);
    const int64_t remainder = nonwrapped_numel - total_wrapped_numel;
    if (!only_wrap_children && remainder >= policy_.min_num_params &&
        !policy_.exclude_module_types.contains(m.type)) {
      wrapped_[static_cast<size_t>(module)] = true;
      return nonwrapped_numel;
    }
    return total_wrapped_numel;
  }

 private:
  const ModelIndex& index_;
  const WrapPolicy& policy_;
  std::vector<bool>& wrapped_;
};

std::vector<bool> MarkWrappedModules(const ModelIndex& index, const WrapPolicy& policy) {
  std::vector<bool> wrapped(index.modules.size(), false);
  switch (policy.kind) {
    case WrapPolicy::Kind::kNone:
      break;
    case WrapPolicy::Kind::kModuleType:
      for (size_t m = 0; m < index.modules.size(); ++m) {
        wrapped[m] = policy.module_types.contains(index.modules[m].type);
      }
      break;
    case WrapPolicy::Kind::kSizeBased:
      SizeBasedWrapper(index, policy, wrapped).Wrap(0, /*only_wrap_children=*/true);
      break;
    case WrapPolicy::Kind::kExplicitFqns:
      for (const std::string& fqn : policy.module_fqns) {
        wrapped[static_cast<size_t>(index.module_by_fqn.at(fqn))] = true;
      }
      break;
    case WrapPolicy::Kind::kAlways:
      std::fill(wrapped.begin(), wrapped.end(), true);
      break;
  }
  wrapped[0] = true;  // FSDP(model) always wraps the root.
  return wrapped;
}

}  // namespace

absl::StatusOr<WrapPolicy> ParseWrapPolicy(absl::string_view text) {
  WrapPolicy policy;
  const size_t colon = text.find(':');
  const absl::string_view kind = text.substr(0, colon);
  const absl::string_view arg =
      colon == absl::string_view::npos ? absl::string_view() : text.substr(colon + 1);
  auto list = [&]() {
    std::vector<std::string> items;
    for (absl::string_view item : absl::StrSplit(arg, ',', absl::SkipWhitespace())) {
      items.emplace_back(item);
    }
    return items;
  };
  if (kind == "none" && arg.empty()) {
    policy.kind = WrapPolicy::Kind::kNone;
  } else if (kind == "always" && arg.empty()) {
    policy.kind = WrapPolicy::Kind::kAlways;
  } else if (kind == "module-type") {
    policy.kind = WrapPolicy::Kind::kModuleType;
    for (std::string& type : list()) policy.module_types.insert(std::move(type));
    if (policy.module_types.empty()) {
      return absl::InvalidArgumentError(
          "--policy module-type: needs at least one type, e.g. module-type:TransformerBlock");
    }
  } else if (kind == "size") {
    policy.kind = WrapPolicy::Kind::kSizeBased;
    const std::string digits = absl::StrReplaceAll(arg, {{"_", ""}});
    double value = 0;
    if (!absl::SimpleAtod(digits, &value) || value != std::floor(value) || value <= 0 ||
        value > 9e18) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--policy size: min_num_params must be a positive integer, got '", arg, "'"));
    }
    policy.min_num_params = static_cast<int64_t>(value);
  } else if (kind == "fqn") {
    policy.kind = WrapPolicy::Kind::kExplicitFqns;
    policy.module_fqns = list();
    if (policy.module_fqns.empty()) {
      return absl::InvalidArgumentError("--policy fqn: needs at least one module FQN");
    }
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("unknown wrap policy '", text,
                     "'; expected none, always, module-type:TYPE[,TYPE], size:MIN_NUM_PARAMS or "
                     "fqn:MODULE[,MODULE]"));
  }
  return policy;
}

std::string WrapPolicyToString(const WrapPolicy& policy) {
  switch (policy.kind) {
    case WrapPolicy::Kind::kNone:
      return "none";
    case WrapPolicy::Kind::kAlways:
      return "always";
    case WrapPolicy::Kind::kModuleType:
      return absl::StrCat("module-type:", absl::StrJoin(policy.module_types, ","));
    case WrapPolicy::Kind::kSizeBased:
      return absl::StrCat("size:", policy.min_num_params);
    case WrapPolicy::Kind::kExplicitFqns:
      return absl::StrCat("fqn:", absl::StrJoin(policy.module_fqns, ","));
  }
  return "?";
}

std::string UnitLabel(const Unit& unit) {
  return absl::StrCat("unit ", unit.index, " (", unit.module_fqn.empty() ? "root" : unit.module_fqn,
                      ")");
}

absl::StatusOr<std::vector<Unit>> ComputeUnits(const ModelIndex& index, const WrapPolicy& policy) {
  if (absl::Status s = CheckPolicyAgainstModel(index, policy); !s.ok()) return s;
  const std::vector<bool> wrapped = MarkWrappedModules(index, policy);

  // Each module's owner is its nearest wrapped ancestor-or-self; pre-order means
  // the parent's owner is known before the child's.
  std::vector<int> owner(index.modules.size(), 0);
  for (size_t m = 0; m < index.modules.size(); ++m) {
    owner[m] =
        wrapped[m] ? static_cast<int>(m) : owner[static_cast<size_t>(index.modules[m].parent)];
  }
  std::map<int, Unit> by_module;  // pre-order of the owning module
  std::vector<int> unit_module_of_param(index.params.size(), -1);
  for (size_t p = 0; p < index.params.size(); ++p) {
    const IndexedParam& param = index.params[p];
    const int unit_module = owner[static_cast<size_t>(param.module)];
    unit_module_of_param[p] = unit_module;
    Unit& unit = by_module[unit_module];
    if (param.primary == static_cast<int>(p)) {
      const ParamSpec& spec = *param.spec;
      const int64_t numel = NumElements(spec.shape);
      unit.params.push_back(UnitParam{param.fqn, static_cast<int>(p), spec.shape, numel, spec.dtype,
                                      spec.requires_grad});
      unit.numel += numel;
      continue;
    }
    const int primary_module = unit_module_of_param[static_cast<size_t>(param.primary)];
    if (primary_module != unit_module) {
      auto label = [&](int module) {
        const std::string& fqn = index.modules[static_cast<size_t>(module)].fqn;
        return fqn.empty() ? std::string("the root unit") : absl::StrCat("the unit of '", fqn, "'");
      };
      const std::string& primary_fqn = index.params[static_cast<size_t>(param.primary)].fqn;
      return absl::InvalidArgumentError(absl::StrCat(
          "tied parameters must be in one unit: '", param.fqn, "' falls in ", label(unit_module),
          " but its primary '", primary_fqn, "' falls in ", label(primary_module),
          "; wrap a module that contains both (or neither) instead"));
    }
    unit.shared.push_back(
        SharedParam{param.fqn, index.params[static_cast<size_t>(param.primary)].fqn});
  }

  std::vector<Unit> units;
  for (auto& [module, unit] : by_module) {
    if (unit.params.empty()) continue;
    unit.index = static_cast<int>(units.size());
    unit.module_index = module;
    unit.module_fqn = index.modules[static_cast<size_t>(module)].fqn;
    unit.module_type = index.modules[static_cast<size_t>(module)].type;
    unit.is_root = module == 0;
    units.push_back(std::move(unit));
  }
  return units;
}

}  // namespace flatshard
