#include "core/job_spec_yaml.h"

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/dtype.h"
#include "core/model_spec_proto.h"
#include "core/model_spec_yaml.h"
#include "core/optimizer.h"
#include "core/status_macros.h"
#include "core/wrap_policy.h"
#include "core/wrap_policy_proto.h"
#include "core/yaml_fields.h"

namespace flatshard {
namespace {

// torch.optim's defaults: every optimizer's lr is 1e-3 and AdamW's weight_decay is
// 0.01. The proto reads 0 as "0", so the file reader fills them in, as the CLI does.
constexpr double kDefaultLr = 1e-3;
constexpr double kDefaultAdamWWeightDecay = 0.01;

template <typename E>
struct EnumName {
  absl::string_view name;
  E value;
};

// The *_UNSPECIFIED values are left out: a file either names a value or omits
// the field.
constexpr EnumName<v1::ShardingStrategy> kStrategies[] = {
    {"FULL_SHARD", v1::FULL_SHARD},
    {"SHARD_GRAD_OP", v1::SHARD_GRAD_OP},
    {"NO_SHARD", v1::NO_SHARD},
    {"HYBRID_SHARD", v1::HYBRID_SHARD},
    {"HYBRID_SHARD_ZERO2", v1::HYBRID_SHARD_ZERO2},
};
constexpr EnumName<v1::BackwardPrefetch> kPrefetches[] = {
    {"BACKWARD_PRE", v1::BACKWARD_PRE},
    {"BACKWARD_POST", v1::BACKWARD_POST},
    {"BACKWARD_NONE", v1::BACKWARD_NONE},
};
constexpr EnumName<v1::StateDictType> kStateDictTypes[] = {
    {"FULL_STATE_DICT", v1::FULL_STATE_DICT},
    {"SHARDED_STATE_DICT", v1::SHARDED_STATE_DICT},
    {"LOCAL_STATE_DICT", v1::LOCAL_STATE_DICT},
};
constexpr EnumName<v1::DataSpec::Kind> kDataKinds[] = {
    {"regression", v1::DataSpec::TEACHER_STUDENT_REGRESSION},
    {"classification", v1::DataSpec::CLASSIFICATION},
    {"tokens", v1::DataSpec::TOKEN_SEQUENCES},
    {"file", v1::DataSpec::FILE},
};

// Case-insensitive, so `full_shard` and `FULL_SHARD` both work.
template <typename E>
absl::StatusOr<E> ReadEnum(const YamlField& field, std::span<const EnumName<E>> names) {
  ASSIGN_OR_RETURN(std::string text, field.AsString());
  std::vector<absl::string_view> known;
  for (const EnumName<E>& entry : names) {
    if (absl::EqualsIgnoreCase(entry.name, text)) return entry.value;
    known.push_back(entry.name);
  }
  return field.Error(
      absl::StrCat("unknown value '", text, "'; expected one of ", absl::StrJoin(known, ", ")));
}

// The proto's int32 fields: a larger number would be silently truncated.
absl::StatusOr<int32_t> ReadInt32(const YamlField& field) {
  ASSIGN_OR_RETURN(int64_t value, field.AsInt());
  if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
    return field.Error(absl::StrCat(value, " does not fit in 32 bits"));
  }
  return static_cast<int32_t>(value);
}

absl::StatusOr<uint64_t> ReadUint64(const YamlField& field) {
  ASSIGN_OR_RETURN(int64_t value, field.AsInt());
  if (value < 0) return field.Error(absl::StrCat("must be >= 0, got ", value));
  return static_cast<uint64_t>(value);
}

absl::StatusOr<v1::DType> ReadDType(const YamlField& field) {
  ASSIGN_OR_RETURN(std::string name, field.AsString());
  absl::StatusOr<DType> dtype = ParseDType(name);
  if (!dtype.ok()) return field.Error(dtype.status().message());
  return DTypeToProto(*dtype);
}

// Each reads map[key] through `read` and hands it to `set` when the key is
// present; an absent key leaves the proto default alone.
template <typename Read, typename Set>
absl::Status IfPresent(const YamlField& map, absl::string_view key, Read read, Set set) {
  if (!map.Has(key)) return absl::OkStatus();
  auto value = read(map.Child(key));
  if (!value.ok()) return value.status();
  set(*std::move(value));
  return absl::OkStatus();
}

template <typename Set>
absl::Status IfBool(const YamlField& map, absl::string_view key, Set set) {
  return IfPresent(
      map, key, [](const YamlField& f) { return f.AsBool(); }, set);
}
template <typename Set>
absl::Status IfDouble(const YamlField& map, absl::string_view key, Set set) {
  return IfPresent(
      map, key, [](const YamlField& f) { return f.AsDouble(); }, set);
}
template <typename Set>
absl::Status IfInt64(const YamlField& map, absl::string_view key, Set set) {
  return IfPresent(
      map, key, [](const YamlField& f) { return f.AsInt(); }, set);
}
template <typename Set>
absl::Status IfInt32(const YamlField& map, absl::string_view key, Set set) {
  return IfPresent(map, key, ReadInt32, set);
}
template <typename Set>
absl::Status IfUint64(const YamlField& map, absl::string_view key, Set set) {
  return IfPresent(map, key, ReadUint64, set);
}
template <typename Set>
absl::Status IfString(const YamlField& map, absl::string_view key, Set set) {
  return IfPresent(
      map, key, [](const YamlField& f) { return f.AsString(); }, set);
}

// Keeps the inner error's code (NOT_FOUND for a missing model file) but says
// where in the job file it was asked for.
absl::Status InJobField(const YamlField& field, const absl::Status& inner) {
  return absl::Status(inner.code(), field.Error(inner.message()).message());
}

// `model: PATH` or an inline mapping. The inline form is read by ParseModelSpec
// from the whole job document (it reads a `model:` key of a larger file), so its
// errors carry the job file's own lines and `model.root...` paths.
absl::StatusOr<v1::ModelSpec> ReadModel(const YamlField& field, absl::string_view text,
                                        const std::string& source, ModelFileLoader load_model) {
  if (field.node.IsMap()) {
    ASSIGN_OR_RETURN(ModelSpec model, ParseModelSpec(text, source));
    return ModelSpecToProto(model);
  }
  if (!field.node.IsScalar()) {
    return field.Error("expected a model file path or an inline model mapping");
  }
  ASSIGN_OR_RETURN(std::string path, field.AsString());
  if (path.empty()) return field.Error("expected a model file path or an inline model mapping");
  absl::StatusOr<ModelSpec> model = load_model(path);
  if (!model.ok()) return InJobField(field, model.status());
  return ModelSpecToProto(*model);
}

absl::Status ReadSharding(const YamlField& field, v1::ShardingConfig& s) {
  RETURN_IF_ERROR(field.OnlyKeys({"strategy", "hybrid_shard_group_size", "backward_prefetch",
                                  "forward_prefetch", "limit_all_gathers", "use_orig_params",
                                  "mixed_precision", "cpu_offload", "sync_module_states"}));
  RETURN_IF_ERROR(IfPresent(
      field, "strategy",
      [](const YamlField& f) { return ReadEnum<v1::ShardingStrategy>(f, kStrategies); },
      [&](v1::ShardingStrategy v) { s.set_strategy(v); }));
  RETURN_IF_ERROR(IfInt32(field, "hybrid_shard_group_size",
                          [&](int32_t v) { s.set_hybrid_shard_group_size(v); }));
  RETURN_IF_ERROR(IfPresent(
      field, "backward_prefetch",
      [](const YamlField& f) { return ReadEnum<v1::BackwardPrefetch>(f, kPrefetches); },
      [&](v1::BackwardPrefetch v) { s.set_backward_prefetch(v); }));
  RETURN_IF_ERROR(IfBool(field, "forward_prefetch", [&](bool v) { s.set_forward_prefetch(v); }));
  // proto3 optional: only a value the file gives overrides FSDP's default (true).
  RETURN_IF_ERROR(IfBool(field, "limit_all_gathers", [&](bool v) { s.set_limit_all_gathers(v); }));
  RETURN_IF_ERROR(IfBool(field, "use_orig_params", [&](bool v) { s.set_use_orig_params(v); }));
  RETURN_IF_ERROR(IfBool(field, "cpu_offload",
                         [&](bool v) { s.mutable_cpu_offload()->set_offload_params(v); }));
  RETURN_IF_ERROR(
      IfBool(field, "sync_module_states", [&](bool v) { s.set_sync_module_states(v); }));
  if (field.Has("mixed_precision")) {
    const YamlField mp = field.Child("mixed_precision");
    RETURN_IF_ERROR(
        mp.OnlyKeys({"param_dtype", "reduce_dtype", "buffer_dtype", "keep_low_precision_grads"}));
    v1::MixedPrecision& out = *s.mutable_mixed_precision();
    RETURN_IF_ERROR(
        IfPresent(mp, "param_dtype", ReadDType, [&](v1::DType v) { out.set_param_dtype(v); }));
    RETURN_IF_ERROR(
        IfPresent(mp, "reduce_dtype", ReadDType, [&](v1::DType v) { out.set_reduce_dtype(v); }));
    RETURN_IF_ERROR(
        IfPresent(mp, "buffer_dtype", ReadDType, [&](v1::DType v) { out.set_buffer_dtype(v); }));
    RETURN_IF_ERROR(IfBool(mp, "keep_low_precision_grads",
                           [&](bool v) { out.set_keep_low_precision_grads(v); }));
  }
  return absl::OkStatus();
}

// A number, or "inf" for the infinity norm (YAML's own `.inf` is a number too).
absl::StatusOr<double> ReadNormType(const YamlField& field) {
  if (field.node.IsScalar()) {
    const std::string text = absl::AsciiStrToLower(field.node.Scalar());
    if (text == "inf" || text == "+inf" || text == "infinity") {
      return std::numeric_limits<double>::infinity();
    }
  }
  return field.AsDouble();
}

absl::Status ReadAdamOptions(const YamlField& field, bool adamw, v1::Optimizer::Adam& p) {
  if (adamw) p.set_weight_decay(kDefaultAdamWWeightDecay);
  if (field.Has("betas")) {
    const YamlField betas = field.Child("betas");
    RETURN_IF_ERROR(betas.ExpectSequence());
    if (betas.size() != 2) {
      return betas.Error(absl::StrCat("expected [beta1, beta2], got ", betas.size(), " numbers"));
    }
    ASSIGN_OR_RETURN(double beta1, betas.Element(0).AsDouble());
    ASSIGN_OR_RETURN(double beta2, betas.Element(1).AsDouble());
    p.set_beta1(beta1);
    p.set_beta2(beta2);
  }
  RETURN_IF_ERROR(IfDouble(field, "eps", [&](double v) { p.set_eps(v); }));
  RETURN_IF_ERROR(IfDouble(field, "weight_decay", [&](double v) { p.set_weight_decay(v); }));
  RETURN_IF_ERROR(IfBool(field, "amsgrad", [&](bool v) { p.set_amsgrad(v); }));
  RETURN_IF_ERROR(IfBool(field, "maximize", [&](bool v) { p.set_maximize(v); }));
  return absl::OkStatus();
}

absl::Status ReadOptimizer(const YamlField& field, v1::Optimizer& o) {
  RETURN_IF_ERROR(
      field.OnlyKeys({"kind", "lr", "weight_decay", "maximize", "momentum", "dampening", "nesterov",
                      "betas", "eps", "amsgrad", "max_grad_norm", "grad_norm_type"}));
  OptimizerKind kind = OptimizerKind::kAdamW;
  if (field.Has("kind")) {
    const EnumName<OptimizerKind> kinds[] = {
        {OptimizerKindName(OptimizerKind::kSgd), OptimizerKind::kSgd},
        {OptimizerKindName(OptimizerKind::kAdam), OptimizerKind::kAdam},
        {OptimizerKindName(OptimizerKind::kAdamW), OptimizerKind::kAdamW},
    };
    ASSIGN_OR_RETURN(kind, ReadEnum<OptimizerKind>(field.Child("kind"), kinds));
  }
  // A setting of the other family would be silently dropped by the proto's oneof.
  const bool sgd = kind == OptimizerKind::kSgd;
  for (absl::string_view key : {"momentum", "dampening", "nesterov"}) {
    if (!sgd && field.Has(key)) return field.Child(key).Error("applies only to kind: sgd");
  }
  for (absl::string_view key : {"betas", "eps", "amsgrad"}) {
    if (sgd && field.Has(key)) return field.Child(key).Error("applies only to kind: adam or adamw");
  }
  o.set_lr(kDefaultLr);
  RETURN_IF_ERROR(IfDouble(field, "lr", [&](double v) { o.set_lr(v); }));
  switch (kind) {
    case OptimizerKind::kSgd: {
      v1::Optimizer::Sgd& p = *o.mutable_sgd();
      RETURN_IF_ERROR(IfDouble(field, "momentum", [&](double v) { p.set_momentum(v); }));
      RETURN_IF_ERROR(IfDouble(field, "dampening", [&](double v) { p.set_dampening(v); }));
      RETURN_IF_ERROR(IfBool(field, "nesterov", [&](bool v) { p.set_nesterov(v); }));
      RETURN_IF_ERROR(IfDouble(field, "weight_decay", [&](double v) { p.set_weight_decay(v); }));
      RETURN_IF_ERROR(IfBool(field, "maximize", [&](bool v) { p.set_maximize(v); }));
      break;
    }
    case OptimizerKind::kAdam:
      RETURN_IF_ERROR(ReadAdamOptions(field, false, *o.mutable_adam()));
      break;
    case OptimizerKind::kAdamW:
      RETURN_IF_ERROR(ReadAdamOptions(field, true, *o.mutable_adamw()));
      break;
  }
  RETURN_IF_ERROR(IfDouble(field, "max_grad_norm", [&](double v) { o.set_max_grad_norm(v); }));
  RETURN_IF_ERROR(
      IfPresent(field, "grad_norm_type", ReadNormType, [&](double v) { o.set_grad_norm_type(v); }));
  return absl::OkStatus();
}

absl::Status ReadData(const YamlField& field, v1::DataSpec& d) {
  RETURN_IF_ERROR(field.OnlyKeys({"kind", "global_batch_size", "sequence_length", "seed", "path"}));
  RETURN_IF_ERROR(IfPresent(
      field, "kind", [](const YamlField& f) { return ReadEnum<v1::DataSpec::Kind>(f, kDataKinds); },
      [&](v1::DataSpec::Kind v) { d.set_kind(v); }));
  RETURN_IF_ERROR(
      IfInt64(field, "global_batch_size", [&](int64_t v) { d.set_global_batch_size(v); }));
  RETURN_IF_ERROR(IfInt64(field, "sequence_length", [&](int64_t v) { d.set_sequence_length(v); }));
  RETURN_IF_ERROR(IfUint64(field, "seed", [&](uint64_t v) { d.set_seed(v); }));
  RETURN_IF_ERROR(IfString(field, "path", [&](std::string v) { d.set_path(std::move(v)); }));
  return absl::OkStatus();
}

absl::Status ReadStateDictConfig(const YamlField& field, v1::StateDictConfig& c) {
  RETURN_IF_ERROR(IfBool(field, "offload_to_cpu", [&](bool v) { c.set_offload_to_cpu(v); }));
  RETURN_IF_ERROR(IfBool(field, "rank0_only", [&](bool v) { c.set_rank0_only(v); }));
  return absl::OkStatus();
}

// The optimizer state dict follows the model's config unless `optim:` says
// otherwise, which is how FSDP jobs are nearly always configured.
absl::Status ReadStateDict(const YamlField& field, v1::StateDictSettings& s) {
  RETURN_IF_ERROR(field.OnlyKeys({"type", "offload_to_cpu", "rank0_only", "optim"}));
  RETURN_IF_ERROR(IfPresent(
      field, "type",
      [](const YamlField& f) { return ReadEnum<v1::StateDictType>(f, kStateDictTypes); },
      [&](v1::StateDictType v) { s.set_state_dict_type(v); }));
  RETURN_IF_ERROR(ReadStateDictConfig(field, *s.mutable_state_dict_config()));
  *s.mutable_optim_state_dict_config() = s.state_dict_config();
  if (field.Has("optim")) {
    const YamlField optim = field.Child("optim");
    RETURN_IF_ERROR(optim.OnlyKeys({"offload_to_cpu", "rank0_only"}));
    RETURN_IF_ERROR(ReadStateDictConfig(optim, *s.mutable_optim_state_dict_config()));
  }
  return absl::OkStatus();
}

absl::Status ReadCheckpoints(const YamlField& field, v1::CheckpointSchedule& c) {
  RETURN_IF_ERROR(
      field.OnlyKeys({"every_steps", "keep_last", "async_save", "in_memory_every_steps"}));
  RETURN_IF_ERROR(IfInt64(field, "every_steps", [&](int64_t v) { c.set_every_steps(v); }));
  RETURN_IF_ERROR(
      IfInt64(field, "in_memory_every_steps", [&](int64_t v) { c.set_in_memory_every_steps(v); }));
  RETURN_IF_ERROR(IfInt32(field, "keep_last", [&](int32_t v) { c.set_keep_last(v); }));
  RETURN_IF_ERROR(IfBool(field, "async_save", [&](bool v) { c.set_async_save(v); }));
  return absl::OkStatus();
}

absl::Status ReadRecovery(const YamlField& field, v1::RecoveryPolicy& r) {
  RETURN_IF_ERROR(
      field.OnlyKeys({"max_restarts", "min_world_size", "spare_wait_s", "min_world_wait_s"}));
  RETURN_IF_ERROR(IfInt32(field, "max_restarts", [&](int32_t v) { r.set_max_restarts(v); }));
  RETURN_IF_ERROR(IfInt32(field, "min_world_size", [&](int32_t v) { r.set_min_world_size(v); }));
  RETURN_IF_ERROR(IfDouble(field, "spare_wait_s", [&](double v) { r.set_spare_wait_s(v); }));
  RETURN_IF_ERROR(
      IfDouble(field, "min_world_wait_s", [&](double v) { r.set_min_world_wait_s(v); }));
  return absl::OkStatus();
}

absl::Status ReadRanks(const YamlField& field, v1::JobSpec& spec) {
  RETURN_IF_ERROR(field.ExpectMap());
  for (const auto& entry : field.node) {
    YamlField key{entry.first, field.path, field.source};
    ASSIGN_OR_RETURN(std::string worker, key.AsString());
    YamlField value{entry.second, absl::StrCat(field.path, ".", worker), field.source};
    ASSIGN_OR_RETURN((*spec.mutable_rank_by_worker_id())[worker], ReadInt32(value));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpecWith(absl::string_view text, const std::string& source,
                                             ModelFileLoader load_model) {
  ASSIGN_OR_RETURN(YAML::Node document, ParseYamlDocument(text, source));
  const YamlField top{document, "", &source};
  RETURN_IF_ERROR(
      top.OnlyKeys({"name", "model", "wrap_policy", "world_size", "seed", "sharding", "optimizer",
                    "data", "state_dict", "checkpoints", "rank_by_worker_id", "recovery"}));
  v1::JobSpec spec;
  RETURN_IF_ERROR(IfString(top, "name", [&](std::string v) { spec.set_name(std::move(v)); }));
  if (top.Has("model")) {
    ASSIGN_OR_RETURN(*spec.mutable_model(),
                     ReadModel(top.Child("model"), text, source, load_model));
  }
  if (top.Has("wrap_policy")) {
    const YamlField field = top.Child("wrap_policy");
    ASSIGN_OR_RETURN(std::string text_policy, field.AsString());
    absl::StatusOr<WrapPolicy> policy = ParseWrapPolicy(text_policy);
    if (!policy.ok()) return field.Error(policy.status().message());
    *spec.mutable_wrap_policy() = WrapPolicyToProto(*policy);
  }
  RETURN_IF_ERROR(IfInt32(top, "world_size", [&](int32_t v) { spec.set_world_size(v); }));
  RETURN_IF_ERROR(IfUint64(top, "seed", [&](uint64_t v) { spec.set_seed(v); }));
  if (top.Has("sharding")) {
    RETURN_IF_ERROR(ReadSharding(top.Child("sharding"), *spec.mutable_sharding()));
  }
  // Always set, so a file without `optimizer:` still trains with torch's defaults
  // rather than the proto's lr of 0.
  RETURN_IF_ERROR(ReadOptimizer(
      top.Has("optimizer") ? top.Child("optimizer")
                           : YamlField{YAML::Node(YAML::NodeType::Map), "optimizer", &source},
      *spec.mutable_optimizer()));
  if (top.Has("data")) {
    RETURN_IF_ERROR(ReadData(top.Child("data"), *spec.mutable_data()));
  }
  if (top.Has("state_dict")) {
    RETURN_IF_ERROR(ReadStateDict(top.Child("state_dict"), *spec.mutable_state_dict_settings()));
  }
  if (top.Has("checkpoints")) {
    RETURN_IF_ERROR(ReadCheckpoints(top.Child("checkpoints"), *spec.mutable_checkpoints()));
  }
  if (top.Has("rank_by_worker_id")) {
    RETURN_IF_ERROR(ReadRanks(top.Child("rank_by_worker_id"), spec));
  }
  if (top.Has("recovery")) {
    RETURN_IF_ERROR(ReadRecovery(top.Child("recovery"), *spec.mutable_recovery()));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> ParseJobDocument(const v1::JobDocument& document) {
  if (document.text().empty()) {
    return absl::InvalidArgumentError("document.text: the job document is empty");
  }
  const std::string source = document.source().empty() ? "job document" : document.source();
  return ParseJobSpecWith(document.text(), source, [&](const std::string& path) {
    auto it = document.files().find(path);
    if (it == document.files().end()) {
      return absl::StatusOr<ModelSpec>(absl::InvalidArgumentError(
          absl::StrCat("model file '", path,
                       "' is not in document.files (the coordinator reads no files "
                       "for a client: send the model file's text with the job document)")));
    }
    return ParseModelSpec(it->second, path);
  });
}

}  // namespace flatshard
