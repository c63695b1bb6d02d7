#include "core/model_spec_yaml.h"

#include "absl/strings/str_cat.h"

#include "core/module_types.h"
#include "core/status_macros.h"
#include "core/yaml_fields.h"

namespace flatshard {
namespace {

constexpr int64_t kMaxRepeat = 100000;

// What one document may expand to, in entries: a module, a parameter, a
// dimension of a shape, an attribute, and each 64 bytes of a name, a type
// or an attribute's key or value. The text alone does not bound it:
// `repeat` nests (a 150-byte document of two nested repeats is 10^10
// modules), a repeated template copies its attributes' strings, and YAML
// aliases list a module (or a parameter) many times. Counted as the tree is
// read and before a repeat's copies are made, so such a document fails
// before it allocates. A million is ~9x the tree of DeepSeek-V3 (~60k
// modules, ~47k parameters); a document at the bound takes ~270 MB and ~5 s
// to read (ModelSpecTest.AliasedModulesPastTheBoundFailAsTheyAreRead).
constexpr int64_t kMaxSpecEntries = 1000000;

// Entries still allowed in the document being read.
struct SpecBudget {
  int64_t left = kMaxSpecEntries;

  // Spends `n` entries for what `field` reads, or says the document is too big.
  absl::Status Spend(const YamlField& field, int64_t n) {
    if (n > left) {
      return field.Error(absl::StrCat(
          "the model expands to more than ", kMaxSpecEntries,
          " entries (modules, parameters, dimensions, attributes, and 64 bytes of names and "
          "values each), counting every copy a 'repeat' or a YAML alias makes"));
    }
    left -= n;
    return absl::OkStatus();
  }
};

int64_t StringEntries(const std::string& text) { return static_cast<int64_t>(text.size() / 64); }

// A parameter's own entries: itself, its dimensions, its name.
int64_t OwnEntries(const ParamSpec& param) {
  return 1 + static_cast<int64_t>(param.shape.size()) + StringEntries(param.name);
}

// A module's own entries (no parameters, no children): itself, its name and
// type, its attributes.
int64_t OwnEntries(const ModuleSpec& module) {
  int64_t n = 1 + StringEntries(module.name) + StringEntries(module.type);
  for (const auto& [key, value] : module.attrs) n += 1 + StringEntries(key) + StringEntries(value);
  return n;
}

// The entries of `module`'s tree, itself included.
int64_t SpecEntries(const ModuleSpec& module) {
  int64_t n = OwnEntries(module);
  for (const ParamSpec& param : module.params) n += OwnEntries(param);
  for (const ModuleSpec& child : module.children) n += SpecEntries(child);
  return n;
}

absl::StatusOr<DType> ReadDType(const YamlField& field) {
  ASSIGN_OR_RETURN(std::string name, field.AsString());
  absl::StatusOr<DType> dtype = ParseDType(name);
  if (!dtype.ok()) return field.Error(dtype.status().message());
  return *dtype;
}

absl::StatusOr<ParamInit> ReadInit(const YamlField& field) {
  RETURN_IF_ERROR(field.OnlyKeys({"kind", "mean", "std", "low", "high"}));
  ParamInit init;
  ASSIGN_OR_RETURN(std::string kind, field.Child("kind").AsString());
  if (kind == "zeros") {
    init.kind = ParamInit::Kind::kZeros;
  } else if (kind == "ones") {
    init.kind = ParamInit::Kind::kOnes;
  } else if (kind == "normal") {
    init.kind = ParamInit::Kind::kNormal;
    init.std = 1.0;
  } else if (kind == "uniform") {
    init.kind = ParamInit::Kind::kUniform;
    init.low = -1.0;
    init.high = 1.0;
  } else if (kind == "default") {
    init.kind = ParamInit::Kind::kDefault;
  } else {
    return field.Child("kind").Error(absl::StrCat(
        "unknown init kind '", kind, "'; expected default, zeros, ones, normal or uniform"));
  }
  if (field.Has("mean")) {
    ASSIGN_OR_RETURN(init.mean, field.Child("mean").AsDouble());
  }
  if (field.Has("std")) {
    ASSIGN_OR_RETURN(init.std, field.Child("std").AsDouble());
  }
  if (field.Has("low")) {
    ASSIGN_OR_RETURN(init.low, field.Child("low").AsDouble());
  }
  if (field.Has("high")) {
    ASSIGN_OR_RETURN(init.high, field.Child("high").AsDouble());
  }
  return init;
}

absl::StatusOr<ParamSpec> ReadParam(const YamlField& field, DType default_dtype,
                                    bool default_frozen) {
  RETURN_IF_ERROR(field.OnlyKeys({"name", "shape", "dtype", "frozen", "init"}));
  ParamSpec param;
  param.source_line = field.line();
  param.dtype = default_dtype;
  param.requires_grad = !default_frozen;
  if (!field.Has("name")) return field.Error("'name' is required");
  ASSIGN_OR_RETURN(param.name, field.Child("name").AsString());
  if (!field.Has("shape")) return field.Error("'shape' is required");
  YamlField shape = field.Child("shape");
  if (shape.node.IsScalar()) {
    ASSIGN_OR_RETURN(int64_t dim, shape.AsInt());
    param.shape.push_back(dim);
  } else {
    RETURN_IF_ERROR(shape.ExpectSequence());
    for (size_t i = 0; i < shape.size(); ++i) {
      ASSIGN_OR_RETURN(int64_t dim, shape.Element(i).AsInt());
      param.shape.push_back(dim);
    }
  }
  if (field.Has("dtype")) {
    ASSIGN_OR_RETURN(param.dtype, ReadDType(field.Child("dtype")));
  }
  if (field.Has("frozen")) {
    ASSIGN_OR_RETURN(bool frozen, field.Child("frozen").AsBool());
    param.requires_grad = !frozen;
  }
  if (field.Has("init")) {
    ASSIGN_OR_RETURN(param.init, ReadInit(field.Child("init")));
  }
  return param;
}

// `needs_name`: false for the root and a repeat's template (named by the caller).
absl::StatusOr<ModuleSpec> ReadModule(const YamlField& field, DType default_dtype, bool needs_name,
                                      SpecBudget& budget);

absl::Status ReadChildren(const YamlField& field, DType dtype, ModuleSpec& module,
                          SpecBudget& budget) {
  RETURN_IF_ERROR(field.ExpectSequence());
  for (size_t i = 0; i < field.size(); ++i) {
    ASSIGN_OR_RETURN(ModuleSpec child, ReadModule(field.Element(i), dtype, true, budget));
    module.children.push_back(std::move(child));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModuleSpec> ReadModule(const YamlField& field, DType default_dtype, bool needs_name,
                                      SpecBudget& budget) {
  RETURN_IF_ERROR(field.ExpectMap());
  RETURN_IF_ERROR(budget.Spend(field, 1));
  ModuleSpec module;
  module.source_line = field.line();
  if (!field.Has("type")) {
    module.type = field.Has("repeat") ? "ModuleList" : "";
    if (module.type.empty()) return field.Error("'type' is required");
  } else {
    ASSIGN_OR_RETURN(module.type, field.Child("type").AsString());
  }
  const ModuleTypeInfo* type = FindModuleType(module.type);
  if (type == nullptr) {
    return field.Child("type").Error(absl::StrCat("unknown module type '", module.type,
                                                  "'; known types: ", KnownModuleTypeList()));
  }
  std::vector<absl::string_view> shorthand = type->shorthand_keys;
  RETURN_IF_ERROR(field.OnlyKeys(
      {"name", "type", "params", "children", "attrs", "repeat", "template", "dtype", "frozen"},
      shorthand));

  if (field.Has("name")) {
    ASSIGN_OR_RETURN(module.name, field.Child("name").AsString());
  } else if (needs_name) {
    return field.Error("'name' is required");
  }
  DType dtype = default_dtype;
  if (field.Has("dtype")) {
    ASSIGN_OR_RETURN(dtype, ReadDType(field.Child("dtype")));
  }
  bool frozen = false;
  if (field.Has("frozen")) {
    ASSIGN_OR_RETURN(frozen, field.Child("frozen").AsBool());
  }

  if (field.Has("attrs")) {
    YamlField attrs = field.Child("attrs");
    RETURN_IF_ERROR(attrs.ExpectMap());
    for (const auto& entry : attrs.node) {
      // Through AsString, so a key is checked as strictly as a value.
      ASSIGN_OR_RETURN(std::string key,
                       (YamlField{entry.first, attrs.path, attrs.source}.AsString()));
      YamlField value{entry.second, absl::StrCat(attrs.path, ".", key), attrs.source};
      ASSIGN_OR_RETURN(module.attrs[key], value.AsString());
    }
  }
  // Its own entries but the one spent on entry: the attributes and strings.
  int64_t spent = OwnEntries(module);
  RETURN_IF_ERROR(budget.Spend(field, spent - 1));

  ShorthandSettings settings;
  for (absl::string_view key : type->shorthand_keys) {
    if (!field.Has(key)) continue;
    YamlField value = field.Child(key);
    bool flag = false;
    if (key == "bias" || key == "elementwise_affine") {
      ASSIGN_OR_RETURN(flag, value.AsBool());
      settings[std::string(key)] = flag ? 1 : 0;
    } else {
      ASSIGN_OR_RETURN(settings[std::string(key)], value.AsInt());
    }
  }
  if (field.Has("params")) {
    if (!settings.empty()) {
      return field.Child("params").Error(absl::StrCat("give either 'params' or the ", module.type,
                                                      " shorthand settings, not both"));
    }
    YamlField params = field.Child("params");
    RETURN_IF_ERROR(params.ExpectSequence());
    for (size_t i = 0; i < params.size(); ++i) {
      ASSIGN_OR_RETURN(ParamSpec param, ReadParam(params.Element(i), dtype, frozen));
      RETURN_IF_ERROR(budget.Spend(params.Element(i), OwnEntries(param)));
      spent += OwnEntries(param);
      module.params.push_back(std::move(param));
    }
  } else if (!settings.empty()) {
    if (absl::Status s = ExpandShorthand(*type, settings, dtype, module); !s.ok()) {
      return field.Error(s.message());
    }
    RETURN_IF_ERROR(budget.Spend(field, SpecEntries(module) - spent));
    for (ParamSpec& param : module.params) {
      param.source_line = module.source_line;
      param.requires_grad = !frozen;
    }
    for (ModuleSpec& child : module.children) {
      for (ParamSpec& param : child.params) param.requires_grad = !frozen;
    }
  }

  if (field.Has("repeat") != field.Has("template")) {
    return field.Error(
        "'repeat' and 'template' go together: 'repeat: N' makes N "
        "copies of 'template' named 0..N-1");
  }
  if (field.Has("repeat")) {
    if (field.Has("children")) {
      return field.Child("children").Error("give either 'children' or 'repeat', not both");
    }
    ASSIGN_OR_RETURN(int64_t repeat, field.Child("repeat").AsInt());
    if (repeat < 1 || repeat > kMaxRepeat) {
      return field.Child("repeat").Error(
          absl::StrCat("must be between 1 and ", kMaxRepeat, ", got ", repeat));
    }
    YamlField tmpl = field.Child("template");
    // Before Has, which yaml-cpp throws for on a scalar.
    RETURN_IF_ERROR(tmpl.ExpectMap());
    if (tmpl.Has("name")) {
      return tmpl.Child("name").Error("a template has no name; copies are named 0..N-1");
    }
    // Read as it stands (no YAML::Clone to name it: a clone copies every
    // alias the template holds, before the budget could count them).
    ASSIGN_OR_RETURN(ModuleSpec first, ReadModule(tmpl, dtype, false, budget));
    first.name = "0";
    // The other copies, before they are made.
    const int64_t template_entries = SpecEntries(first);
    if (repeat - 1 > budget.left / template_entries) {
      return field.Child("repeat").Error(absl::StrCat(repeat, " copies of a template of ",
                                                      template_entries, " entries make more than ",
                                                      kMaxSpecEntries, " in the model"));
    }
    budget.left -= (repeat - 1) * template_entries;
    for (int64_t i = 0; i < repeat; ++i) {
      ModuleSpec copy = first;
      copy.name = std::to_string(i);
      module.children.push_back(std::move(copy));
    }
  }
  if (field.Has("children")) {
    RETURN_IF_ERROR(ReadChildren(field.Child("children"), dtype, module, budget));
  }
  return module;
}

absl::StatusOr<ModelSpec> ReadModel(const YamlField& field) {
  RETURN_IF_ERROR(field.OnlyKeys({"name", "dtype", "root", "tied"}));
  ModelSpec spec;
  spec.source = *field.source;
  if (field.Has("name")) {
    ASSIGN_OR_RETURN(spec.name, field.Child("name").AsString());
  }
  DType dtype = DType::kFloat32;
  if (field.Has("dtype")) {
    ASSIGN_OR_RETURN(dtype, ReadDType(field.Child("dtype")));
  }
  if (!field.Has("root")) return field.Error("'root' (the top module) is required");
  SpecBudget budget;
  ASSIGN_OR_RETURN(spec.root, ReadModule(field.Child("root"), dtype, false, budget));
  spec.root.name.clear();
  if (field.Has("tied")) {
    YamlField tied = field.Child("tied");
    RETURN_IF_ERROR(tied.ExpectSequence());
    for (size_t i = 0; i < tied.size(); ++i) {
      YamlField entry = tied.Element(i);
      RETURN_IF_ERROR(entry.OnlyKeys({"alias", "primary"}));
      TiedParam tie;
      tie.source_line = entry.line();
      if (!entry.Has("alias") || !entry.Has("primary")) {
        return entry.Error("a tie needs both 'alias' and 'primary' (parameter FQNs)");
      }
      ASSIGN_OR_RETURN(tie.alias_fqn, entry.Child("alias").AsString());
      ASSIGN_OR_RETURN(tie.primary_fqn, entry.Child("primary").AsString());
      spec.tied.push_back(std::move(tie));
    }
  }
  RETURN_IF_ERROR(ValidateModelSpec(spec));
  return spec;
}

}  // namespace

absl::StatusOr<ModelSpec> ParseModelSpec(absl::string_view text, const std::string& source) {
  ASSIGN_OR_RETURN(YAML::Node document, ParseYamlDocument(text, source));
  YamlField top{document, "", &source};
  RETURN_IF_ERROR(top.ExpectMap());
  if (top.Has("model") && !top.Has("root")) {
    YamlField model = top.Child("model");
    return ReadModel(model);
  }
  return ReadModel(top);
}

}  // namespace flatshard
