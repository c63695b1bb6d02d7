#include "core/model_spec_proto.h"

#include "absl/strings/str_cat.h"

#include "core/status_macros.h"

namespace flatshard {
namespace {

v1::ParamInit::Kind InitKindToProto(ParamInit::Kind kind) {
  switch (kind) {
    case ParamInit::Kind::kDefault:
      return v1::ParamInit::KIND_UNSPECIFIED;
    case ParamInit::Kind::kZeros:
      return v1::ParamInit::KIND_ZEROS;
    case ParamInit::Kind::kOnes:
      return v1::ParamInit::KIND_ONES;
    case ParamInit::Kind::kNormal:
      return v1::ParamInit::KIND_NORMAL;
    case ParamInit::Kind::kUniform:
      return v1::ParamInit::KIND_UNIFORM;
  }
  return v1::ParamInit::KIND_UNSPECIFIED;
}

absl::StatusOr<ParamInit::Kind> InitKindFromProto(v1::ParamInit::Kind kind,
                                                  const std::string& field) {
  switch (kind) {
    case v1::ParamInit::KIND_UNSPECIFIED:
      return ParamInit::Kind::kDefault;
    case v1::ParamInit::KIND_ZEROS:
      return ParamInit::Kind::kZeros;
    case v1::ParamInit::KIND_ONES:
      return ParamInit::Kind::kOnes;
    case v1::ParamInit::KIND_NORMAL:
      return ParamInit::Kind::kNormal;
    case v1::ParamInit::KIND_UNIFORM:
      return ParamInit::Kind::kUniform;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown init kind ", static_cast<int>(kind)));
}

void ModuleToProto(const ModuleSpec& module, v1::ModuleSpec& out) {
  out.set_name(module.name);
  out.set_type(module.type);
  for (const auto& [key, value] : module.attrs) (*out.mutable_attrs())[key] = value;
  for (const ParamSpec& param : module.params) {
    v1::ParamSpec* p = out.add_params();
    p->set_name(param.name);
    for (int64_t d : param.shape) p->add_shape(d);
    p->set_dtype(DTypeToProto(param.dtype));
    p->set_frozen(!param.requires_grad);
    p->mutable_init()->set_kind(InitKindToProto(param.init.kind));
    p->mutable_init()->set_mean(param.init.mean);
    p->mutable_init()->set_std(param.init.std);
    p->mutable_init()->set_low(param.init.low);
    p->mutable_init()->set_high(param.init.high);
  }
  for (const ModuleSpec& child : module.children) {
    ModuleToProto(child, *out.add_children());
  }
}

absl::Status ModuleFromProto(const v1::ModuleSpec& proto, const std::string& field,
                             ModuleSpec& out) {
  out.name = proto.name();
  out.type = proto.type();
  for (const auto& [key, value] : proto.attrs()) out.attrs[key] = value;
  for (int i = 0; i < proto.params_size(); ++i) {
    const v1::ParamSpec& p = proto.params(i);
    const std::string param_field = absl::StrCat(field, ".params[", i, "]");
    ParamSpec param;
    param.name = p.name();
    param.shape.assign(p.shape().begin(), p.shape().end());
    ASSIGN_OR_RETURN(param.dtype, DTypeFromProto(p.dtype(), DType::kFloat32,
                                                 absl::StrCat(param_field, ".dtype")));
    param.requires_grad = !p.frozen();
    ASSIGN_OR_RETURN(param.init.kind,
                     InitKindFromProto(p.init().kind(), absl::StrCat(param_field, ".init")));
    param.init.mean = p.init().mean();
    param.init.std = p.init().std();
    param.init.low = p.init().low();
    param.init.high = p.init().high();
    out.params.push_back(std::move(param));
  }
  for (int i = 0; i < proto.children_size(); ++i) {
    ModuleSpec child;
    RETURN_IF_ERROR(
        ModuleFromProto(proto.children(i), absl::StrCat(field, ".children[", i, "]"), child));
    out.children.push_back(std::move(child));
  }
  return absl::OkStatus();
}

}  // namespace

v1::DType DTypeToProto(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case DType::kFloat64:
      return v1::DTYPE_FLOAT64;
    case DType::kFloat16:
      return v1::DTYPE_FLOAT16;
    case DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case DType::kInt32:
      return v1::DTYPE_INT32;
    case DType::kInt64:
      return v1::DTYPE_INT64;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<DType> DTypeFromProto(v1::DType dtype, DType unset_value, const std::string& field) {
  switch (dtype) {
    case v1::DTYPE_UNSPECIFIED:
      return unset_value;
    case v1::DTYPE_FLOAT32:
      return DType::kFloat32;
    case v1::DTYPE_FLOAT64:
      return DType::kFloat64;
    case v1::DTYPE_FLOAT16:
      return DType::kFloat16;
    case v1::DTYPE_BFLOAT16:
      return DType::kBFloat16;
    case v1::DTYPE_INT32:
      return DType::kInt32;
    case v1::DTYPE_INT64:
      return DType::kInt64;
    default:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(field, ": unknown dtype value ", static_cast<int>(dtype)));
}

v1::ModelSpec ModelSpecToProto(const ModelSpec& spec) {
  v1::ModelSpec proto;
  proto.set_name(spec.name);
  ModuleToProto(spec.root, *proto.mutable_root());
  for (const TiedParam& tie : spec.tied) {
    v1::TiedParam* t = proto.add_tied();
    t->set_alias_fqn(tie.alias_fqn);
    t->set_primary_fqn(tie.primary_fqn);
  }
  return proto;
}

absl::StatusOr<ModelSpec> ModelSpecFromProto(const v1::ModelSpec& proto) {
  ModelSpec spec;
  spec.name = proto.name();
  spec.source = "model";
  if (!proto.has_root()) {
    return absl::InvalidArgumentError("model.root: the model needs a root module");
  }
  RETURN_IF_ERROR(ModuleFromProto(proto.root(), "model.root", spec.root));
  for (const v1::TiedParam& t : proto.tied()) {
    spec.tied.push_back(TiedParam{t.alias_fqn(), t.primary_fqn(), 0});
  }
  RETURN_IF_ERROR(ValidateModelSpec(spec));
  return spec;
}

}  // namespace flatshard
