#include "core/module_types.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace flatshard {
namespace {

const std::vector<ModuleTypeInfo>& AllTypes() {
  static const auto* const kTypes = new std::vector<ModuleTypeInfo>{
      {"Module", ModuleKind::kContainer, {}},
      {"Sequential", ModuleKind::kContainer, {}},
      {"ModuleList", ModuleKind::kContainer, {}},
      {"ModuleDict", ModuleKind::kContainer, {}},
      {"Residual", ModuleKind::kContainer, {}},
      {"MLP", ModuleKind::kContainer, {}},
      {"TransformerBlock", ModuleKind::kContainer, {}},
      {"CausalSelfAttention", ModuleKind::kContainer, {}},
      {"GPT", ModuleKind::kContainer, {}},
      {"ReLU", ModuleKind::kActivation, {}},
      {"GELU", ModuleKind::kActivation, {}},
      {"Identity", ModuleKind::kActivation, {}},
      {"Dropout", ModuleKind::kActivation, {}},
      {"Linear", ModuleKind::kLinear, {"in_features", "out_features", "bias"}},
      {"LayerNorm", ModuleKind::kLayerNorm, {"normalized_shape", "elementwise_affine", "bias"}},
      {"Embedding", ModuleKind::kEmbedding, {"num_embeddings", "embedding_dim"}},
      {"MultiheadAttention", ModuleKind::kAttention, {"embed_dim", "bias"}},
  };
  return *kTypes;
}

ParamSpec MakeParam(std::string name, std::vector<int64_t> shape, DType dtype) {
  ParamSpec param;
  param.name = std::move(name);
  param.shape = std::move(shape);
  param.dtype = dtype;
  return param;
}

absl::StatusOr<int64_t> Required(const ShorthandSettings& settings, absl::string_view key) {
  auto it = settings.find(std::string(key));
  if (it == settings.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", key, "' is required with the shorthand form"));
  }
  if (it->second <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("'", key, "' must be > 0, got ", it->second));
  }
  return it->second;
}

bool Flag(const ShorthandSettings& settings, absl::string_view key, bool default_value) {
  auto it = settings.find(std::string(key));
  return it == settings.end() ? default_value : it->second != 0;
}

const ParamSpec* FindParam(const ModuleSpec& module, absl::string_view name) {
  for (const ParamSpec& param : module.params) {
    if (param.name == name) return &param;
  }
  return nullptr;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::Status OnlyParams(const ModuleSpec& module, absl::string_view type,
                        const std::vector<absl::string_view>& allowed) {
  for (const ParamSpec& param : module.params) {
    bool ok = false;
    for (absl::string_view name : allowed) ok = ok || param.name == name;
    if (!ok) {
      return absl::InvalidArgumentError(
          absl::StrCat("parameter '", param.name, "' is not a parameter of ", type,
                       " (allowed: ", absl::StrJoin(allowed, ", "), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status NoChildren(const ModuleSpec& module, absl::string_view type) {
  if (!module.children.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(type, " cannot have children, found '", module.children.front().name, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

const ModuleTypeInfo* FindModuleType(absl::string_view name) {
  for (const ModuleTypeInfo& type : AllTypes()) {
    if (type.name == name) return &type;
  }
  return nullptr;
}

std::string KnownModuleTypeList() {
  std::vector<absl::string_view> names;
  for (const ModuleTypeInfo& type : AllTypes()) names.push_back(type.name);
  return absl::StrJoin(names, ", ");
}

absl::Status ExpandShorthand(const ModuleTypeInfo& type, const ShorthandSettings& settings,
                             DType dtype, ModuleSpec& module) {
  switch (type.kind) {
    case ModuleKind::kLinear: {
      absl::StatusOr<int64_t> in = Required(settings, "in_features");
      if (!in.ok()) return in.status();
      absl::StatusOr<int64_t> out = Required(settings, "out_features");
      if (!out.ok()) return out.status();
      module.params.push_back(MakeParam("weight", {*out, *in}, dtype));
      if (Flag(settings, "bias", true)) {
        module.params.push_back(MakeParam("bias", {*out}, dtype));
      }
      return absl::OkStatus();
    }
    case ModuleKind::kLayerNorm: {
      absl::StatusOr<int64_t> dim = Required(settings, "normalized_shape");
      if (!dim.ok()) return dim.status();
      if (Flag(settings, "elementwise_affine", true)) {
        module.params.push_back(MakeParam("weight", {*dim}, dtype));
        if (Flag(settings, "bias", true)) {
          module.params.push_back(MakeParam("bias", {*dim}, dtype));
        }
      } else {
        // Without a weight nothing else would keep the width: the workers
        // check their input against it, and a client rebuilding the torch
        // module (torch_modules.build) needs it.
        module.attrs.insert_or_assign("normalized_shape", absl::StrCat(*dim));
      }
      return absl::OkStatus();
    }
    case ModuleKind::kEmbedding: {
      absl::StatusOr<int64_t> num = Required(settings, "num_embeddings");
      if (!num.ok()) return num.status();
      absl::StatusOr<int64_t> dim = Required(settings, "embedding_dim");
      if (!dim.ok()) return dim.status();
      module.params.push_back(MakeParam("weight", {*num, *dim}, dtype));
      return absl::OkStatus();
    }
    case ModuleKind::kAttention: {
      absl::StatusOr<int64_t> dim = Required(settings, "embed_dim");
      if (!dim.ok()) return dim.status();
      const bool bias = Flag(settings, "bias", true);
      module.params.push_back(MakeParam("in_proj_weight", {3 * *dim, *dim}, dtype));
      if (bias) module.params.push_back(MakeParam("in_proj_bias", {3 * *dim}, dtype));
      ModuleSpec out_proj;
      out_proj.name = "out_proj";
      out_proj.type = "Linear";
      out_proj.source_line = module.source_line;
      out_proj.params.push_back(MakeParam("weight", {*dim, *dim}, dtype));
      if (bias) out_proj.params.push_back(MakeParam("bias", {*dim}, dtype));
      module.children.push_back(std::move(out_proj));
      return absl::OkStatus();
    }
    case ModuleKind::kContainer:
    case ModuleKind::kActivation:
      break;
  }
  return absl::InvalidArgumentError(absl::StrCat(type.name, " has no shorthand settings"));
}

absl::Status CheckModuleAgainstType(const ModuleSpec& module, const ModuleTypeInfo& type) {
  switch (type.kind) {
    case ModuleKind::kContainer:
    case ModuleKind::kAttention:
      return absl::OkStatus();
    case ModuleKind::kActivation:
      if (!module.params.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(type.name, " has no parameters, found '",
                                                       module.params.front().name, "'"));
      }
      return NoChildren(module, type.name);
    case ModuleKind::kLinear: {
      if (absl::Status s = OnlyParams(module, type.name, {"weight", "bias"}); !s.ok()) {
        return s;
      }
      const ParamSpec* weight = FindParam(module, "weight");
      if (weight == nullptr) {
        return absl::InvalidArgumentError("Linear needs a 'weight' parameter");
      }
      if (weight->shape.size() != 2) {
        return absl::InvalidArgumentError(
            absl::StrCat("Linear weight must be 2-D [out_features, in_features], got ",
                         ShapeString(weight->shape)));
      }
      const ParamSpec* bias = FindParam(module, "bias");
      if (bias != nullptr && (bias->shape.size() != 1 || bias->shape[0] != weight->shape[0])) {
        return absl::InvalidArgumentError(
            absl::StrCat("Linear bias must be [", weight->shape[0], "] to match weight ",
                         ShapeString(weight->shape), ", got ", ShapeString(bias->shape)));
      }
      return NoChildren(module, type.name);
    }
    case ModuleKind::kLayerNorm: {
      if (absl::Status s = OnlyParams(module, type.name, {"weight", "bias"}); !s.ok()) {
        return s;
      }
      const ParamSpec* weight = FindParam(module, "weight");
      const ParamSpec* bias = FindParam(module, "bias");
      if (weight != nullptr && weight->shape.size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("LayerNorm weight must be 1-D, got ", ShapeString(weight->shape)));
      }
      if (bias != nullptr && weight != nullptr && bias->shape != weight->shape) {
        return absl::InvalidArgumentError(absl::StrCat("LayerNorm bias ", ShapeString(bias->shape),
                                                       " must match weight ",
                                                       ShapeString(weight->shape)));
      }
      if (bias != nullptr && weight == nullptr) {
        return absl::InvalidArgumentError("LayerNorm has a bias but no weight");
      }
      if (auto it = module.attrs.find("normalized_shape"); it != module.attrs.end()) {
        int64_t dim = 0;
        if (!absl::SimpleAtoi(it->second, &dim) || dim <= 0) {
          return absl::InvalidArgumentError(absl::StrCat(
              "LayerNorm attrs.normalized_shape must be an integer > 0, got '", it->second, "'"));
        }
        if (weight != nullptr && weight->shape != std::vector<int64_t>{dim}) {
          return absl::InvalidArgumentError(absl::StrCat("LayerNorm attrs.normalized_shape ", dim,
                                                         " does not match weight ",
                                                         ShapeString(weight->shape)));
        }
      }
      return NoChildren(module, type.name);
    }
    case ModuleKind::kEmbedding: {
      if (absl::Status s = OnlyParams(module, type.name, {"weight"}); !s.ok()) {
        return s;
      }
      const ParamSpec* weight = FindParam(module, "weight");
      if (weight == nullptr || weight->shape.size() != 2) {
        return absl::InvalidArgumentError(
            "Embedding needs a 2-D 'weight' [num_embeddings, embedding_dim]");
      }
      return NoChildren(module, type.name);
    }
  }
  return absl::OkStatus();
}

}  // namespace flatshard
