#include "core/model_spec.h"

#include <functional>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/module_types.h"
#include "core/status_macros.h"

namespace flatshard {
namespace {

bool IsValidName(const std::string& name) {
  if (name.empty()) return false;
  for (char c : name) {
    const bool ok =
        (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    if (!ok) return false;
  }
  return true;
}

std::string ModuleLabel(const std::string& fqn) {
  return fqn.empty() ? std::string("root module") : absl::StrCat("module '", fqn, "'");
}

// Bounds that keep every numel, byte count and offset derived from a model
// (times a dtype size, plus padding, times a world size) far inside int64.
constexpr int64_t kMaxParamElements = int64_t{1} << 40;
constexpr int64_t kMaxModelElements = int64_t{1} << 44;

class Validator {
 public:
  explicit Validator(const ModelSpec& spec) : spec_(spec) {}

  absl::Status Run() {
    if (spec_.root.type.empty()) {
      return Error(spec_.root.source_line, "root: 'type' is required");
    }
    RETURN_IF_ERROR(VisitModule(spec_.root, ""));
    RETURN_IF_ERROR(CheckTies());
    if (total_params_ == 0) {
      return Error(spec_.root.source_line,
                   "model has no parameters; FSDP needs at least one to shard");
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Error(int line, const std::string& message) const {
    return absl::InvalidArgumentError(absl::StrCat(SpecLocation(spec_, line), message));
  }

  absl::Status VisitModule(const ModuleSpec& module, const std::string& fqn) {
    const ModuleTypeInfo* type = FindModuleType(module.type);
    if (type == nullptr) {
      return Error(module.source_line,
                   absl::StrCat(ModuleLabel(fqn), ": unknown module type '", module.type,
                                "'; known types: ", KnownModuleTypeList()));
    }
    if (absl::Status s = CheckModuleAgainstType(module, *type); !s.ok()) {
      return Error(module.source_line,
                   absl::StrCat(ModuleLabel(fqn), " (", module.type, "): ", s.message()));
    }
    std::set<std::string> names;
    for (const ParamSpec& param : module.params) {
      const std::string param_fqn = JoinFqn(fqn, param.name);
      if (!IsValidName(param.name)) {
        return Error(param.source_line,
                     absl::StrCat(ModuleLabel(fqn), ": parameter name '", param.name,
                                  "' must be non-empty and use only letters, digits "
                                  "and '_'"));
      }
      if (!names.insert(param.name).second) {
        return Error(param.source_line, absl::StrCat("duplicate parameter FQN '", param_fqn, "'"));
      }
      RETURN_IF_ERROR(CheckParam(param, param_fqn));
      params_.emplace(param_fqn, &param);
    }
    for (const ModuleSpec& child : module.children) {
      if (!IsValidName(child.name)) {
        return Error(child.source_line,
                     absl::StrCat(ModuleLabel(fqn), ": child name '", child.name,
                                  "' must be non-empty and use only letters, digits "
                                  "and '_'"));
      }
      const std::string child_fqn = JoinFqn(fqn, child.name);
      if (!names.insert(child.name).second) {
        return Error(child.source_line,
                     absl::StrCat("duplicate FQN '", child_fqn,
                                  "': two children (or a child and a parameter) of ",
                                  ModuleLabel(fqn), " share the name '", child.name, "'"));
      }
      RETURN_IF_ERROR(VisitModule(child, child_fqn));
    }
    return absl::OkStatus();
  }

  absl::Status CheckParam(const ParamSpec& param, const std::string& fqn) {
    int64_t numel = 1;
    for (size_t d = 0; d < param.shape.size(); ++d) {
      if (param.shape[d] <= 0) {
        return Error(param.source_line, absl::StrCat("parameter '", fqn, "': shape[", d,
                                                     "] must be > 0, got ", param.shape[d]));
      }
      // Checked: a product past int64 would wrap and pass every later check.
      if (param.shape[d] > kMaxParamElements / numel) {
        return Error(param.source_line,
                     absl::StrCat("parameter '", fqn, "' has more than ", kMaxParamElements,
                                  " elements (shape [", absl::StrJoin(param.shape, ", "),
                                  "]); flatshard's limit per parameter is 2^40"));
      }
      numel *= param.shape[d];
    }
    total_elements_ += numel;
    if (total_elements_ > kMaxModelElements) {
      return Error(param.source_line, absl::StrCat("the model has more than ", kMaxModelElements,
                                                   " elements by parameter '", fqn,
                                                   "'; flatshard's limit per model is 2^44"));
    }
    if (param.requires_grad && !IsFloating(param.dtype)) {
      return Error(param.source_line,
                   absl::StrCat("parameter '", fqn, "' has dtype ", DTypeName(param.dtype),
                                "; only floating dtypes can be trained and sharded "
                                "(mark it frozen: true to keep it)"));
    }
    const ParamInit& init = param.init;
    if (init.kind == ParamInit::Kind::kNormal && init.std <= 0.0) {
      return Error(param.source_line,
                   absl::StrCat("parameter '", fqn, "': init.std must be > 0, got ", init.std));
    }
    if (init.kind == ParamInit::Kind::kUniform && !(init.low < init.high)) {
      return Error(param.source_line, absl::StrCat("parameter '", fqn, "': init.low (", init.low,
                                                   ") must be < init.high (", init.high, ")"));
    }
    ++total_params_;
    return absl::OkStatus();
  }

  absl::Status CheckTies() {
    std::set<std::string> aliases;
    for (const TiedParam& tie : spec_.tied) {
      auto alias = params_.find(tie.alias_fqn);
      if (alias == params_.end()) {
        return Error(tie.source_line, absl::StrCat("tied.alias '", tie.alias_fqn,
                                                   "' is not a parameter of the model"));
      }
      auto primary = params_.find(tie.primary_fqn);
      if (primary == params_.end()) {
        return Error(tie.source_line,
                     absl::StrCat("tied parameter '", tie.alias_fqn, "' points nowhere: primary '",
                                  tie.primary_fqn, "' is not a parameter of the model"));
      }
      if (tie.alias_fqn == tie.primary_fqn) {
        return Error(tie.source_line,
                     absl::StrCat("tied parameter '", tie.alias_fqn, "' is tied to itself"));
      }
      if (!aliases.insert(tie.alias_fqn).second) {
        return Error(tie.source_line,
                     absl::StrCat("tied.alias '", tie.alias_fqn, "' is declared twice"));
      }
      const ParamSpec& a = *alias->second;
      const ParamSpec& p = *primary->second;
      if (a.shape != p.shape || a.dtype != p.dtype) {
        return Error(
            tie.source_line,
            absl::StrCat("tied parameter '", tie.alias_fqn, "' [", absl::StrJoin(a.shape, ", "),
                         "] ", DTypeName(a.dtype), " does not match its primary '", tie.primary_fqn,
                         "' [", absl::StrJoin(p.shape, ", "), "] ", DTypeName(p.dtype)));
      }
      if (a.requires_grad != p.requires_grad) {
        return Error(tie.source_line,
                     absl::StrCat("tied parameter '", tie.alias_fqn, "' and its primary '",
                                  tie.primary_fqn, "' disagree on frozen"));
      }
    }
    return absl::OkStatus();
  }

  const ModelSpec& spec_;
  std::map<std::string, const ParamSpec*> params_;
  int64_t total_params_ = 0;
  int64_t total_elements_ = 0;  // each at most kMaxParamElements, so no overflow
};

void Walk(const ModuleSpec& module, const std::string& fqn, int parent, int depth,
          ModelIndex& index) {
  const int me = static_cast<int>(index.modules.size());
  index.modules.push_back(IndexedModule{fqn, module.type, parent, depth, {}, {}, 0});
  index.module_by_fqn[fqn] = me;
  if (parent >= 0) index.modules[static_cast<size_t>(parent)].children.push_back(me);
  for (const ParamSpec& param : module.params) {
    const int p = static_cast<int>(index.params.size());
    std::string param_fqn = JoinFqn(fqn, param.name);
    index.param_by_fqn[param_fqn] = p;
    index.params.push_back(IndexedParam{std::move(param_fqn), me, &param, p});
    index.modules[static_cast<size_t>(me)].params.push_back(p);
  }
  for (const ModuleSpec& child : module.children) {
    Walk(child, JoinFqn(fqn, child.name), me, depth + 1, index);
  }
  index.modules[static_cast<size_t>(me)].subtree_end = static_cast<int>(index.modules.size());
}

}  // namespace

int64_t NumElements(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string JoinFqn(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : absl::StrCat(prefix, ".", name);
}

std::string SpecLocation(const ModelSpec& spec, int line) {
  if (spec.source.empty()) return line > 0 ? absl::StrCat("line ", line, ": ") : "";
  return line > 0 ? absl::StrCat(spec.source, ":", line, ": ") : absl::StrCat(spec.source, ": ");
}

int64_t ModelIndex::SubtreeNumel(int module) const {
  std::set<int> seen_primaries;
  int64_t total = 0;
  const IndexedModule& root = modules[static_cast<size_t>(module)];
  for (int m = module; m < root.subtree_end; ++m) {
    for (int p : modules[static_cast<size_t>(m)].params) {
      const IndexedParam& param = params[static_cast<size_t>(p)];
      if (seen_primaries.insert(param.primary).second) {
        total += NumElements(param.spec->shape);
      }
    }
  }
  return total;
}

absl::Status ValidateModelSpec(const ModelSpec& spec) { return Validator(spec).Run(); }

absl::StatusOr<ModelIndex> IndexModel(const ModelSpec& spec) {
  RETURN_IF_ERROR(ValidateModelSpec(spec));
  ModelIndex index;
  Walk(spec.root, "", -1, 0, index);

  // Union the tie groups; the primary is the first member in traversal order, as
  // FSDP's shared_param_memo makes it (docs/fsdp-semantics.md §1.1).
  std::vector<int> parent(index.params.size());
  for (size_t i = 0; i < parent.size(); ++i) parent[i] = static_cast<int>(i);
  std::function<int(int)> find = [&](int x) {
    while (parent[static_cast<size_t>(x)] != x) {
      x = parent[static_cast<size_t>(x)] =
          parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
    }
    return x;
  };
  for (const TiedParam& tie : spec.tied) {
    int a = find(index.param_by_fqn.at(tie.alias_fqn));
    int b = find(index.param_by_fqn.at(tie.primary_fqn));
    if (a != b) parent[static_cast<size_t>(std::max(a, b))] = std::min(a, b);
  }
  for (size_t i = 0; i < index.params.size(); ++i) {
    index.params[i].primary = find(static_cast<int>(i));
  }
  return index;
}

}  // namespace flatshard
