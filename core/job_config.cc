#include "core/job_config.h"

#include <algorithm>
#include <cmath>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

#include "core/flat_param_layout.h"
#include "core/model_spec_proto.h"
#include "core/plan.h"
#include "core/status_macros.h"

namespace flatshard {
namespace {

constexpr int kMaxWorldSize = 65536;

absl::Status Invalid(absl::string_view field, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat("job.", field, " ", problem));
}

// Prefixes a core error with the job field it came from.
absl::Status InField(absl::string_view field, const absl::Status& status) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat("job.", field, ": ", status.message()));
}

bool ValidName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                    c == '-' || c == '_' || c == '.';
    if (!ok) return false;
  }
  return name != "." && name != "..";
}

absl::StatusOr<WrapPolicy> WrapPolicyFromProto(const v1::WrapPolicy& proto) {
  WrapPolicy policy;
  switch (proto.policy_case()) {
    case v1::WrapPolicy::POLICY_NOT_SET:
      policy.kind = WrapPolicy::Kind::kNone;
      break;
    case v1::WrapPolicy::kModuleType:
      policy.kind = WrapPolicy::Kind::kModuleType;
      policy.module_types.insert(proto.module_type().module_types().begin(),
                                 proto.module_type().module_types().end());
      break;
    case v1::WrapPolicy::kSizeBased: {
      const auto& s = proto.size_based();
      policy.kind = WrapPolicy::Kind::kSizeBased;
      policy.min_num_params = s.min_num_params();
      if (s.override_defaults() || s.force_leaf_module_types_size() > 0) {
        policy.force_leaf_module_types = {s.force_leaf_module_types().begin(),
                                          s.force_leaf_module_types().end()};
      }
      if (s.override_defaults() || s.exclude_module_types_size() > 0) {
        policy.exclude_module_types = {s.exclude_module_types().begin(),
                                       s.exclude_module_types().end()};
      }
      break;
    }
    case v1::WrapPolicy::kExplicitFqns:
      policy.kind = WrapPolicy::Kind::kExplicitFqns;
      policy.module_fqns.assign(proto.explicit_fqns().module_fqns().begin(),
                                proto.explicit_fqns().module_fqns().end());
      break;
    case v1::WrapPolicy::kAlways:
      policy.kind = WrapPolicy::Kind::kAlways;
      break;
  }
  return policy;
}

absl::StatusOr<ShardingSettings> ShardingFromProto(const v1::ShardingConfig& proto,
                                                   int world_size) {
  ShardingSettings s;
  switch (proto.strategy()) {
    case v1::SHARDING_STRATEGY_UNSPECIFIED:
    case v1::FULL_SHARD:
      s.strategy = ShardingStrategy::kFullShard;
      break;
    case v1::SHARD_GRAD_OP:
      s.strategy = ShardingStrategy::kShardGradOp;
      break;
    case v1::NO_SHARD:
      s.strategy = ShardingStrategy::kNoShard;
      break;
    case v1::HYBRID_SHARD:
      s.strategy = ShardingStrategy::kHybridShard;
      break;
    case v1::HYBRID_SHARD_ZERO2:
      s.strategy = ShardingStrategy::kHybridShardZero2;
      break;
    default:
      return Invalid("sharding.strategy",
                     absl::StrCat("has unknown value ", static_cast<int>(proto.strategy())));
  }
  s.hybrid_shard_group_size = proto.hybrid_shard_group_size();
  if (absl::Status st =
          ComputeRankLayout(s.strategy, world_size, s.hybrid_shard_group_size).status();
      !st.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("job.", st.message()));
  }
  switch (proto.backward_prefetch()) {
    case v1::BACKWARD_PREFETCH_UNSPECIFIED:
    case v1::BACKWARD_PRE:
      s.backward_prefetch = BackwardPrefetch::kPre;
      break;
    case v1::BACKWARD_POST:
      s.backward_prefetch = BackwardPrefetch::kPost;
      break;
    case v1::BACKWARD_NONE:
      s.backward_prefetch = BackwardPrefetch::kNone;
      break;
    default:
      return Invalid(
          "sharding.backward_prefetch",
          absl::StrCat("has unknown value ", static_cast<int>(proto.backward_prefetch())));
  }
  s.forward_prefetch = proto.forward_prefetch();
  s.limit_all_gathers = proto.has_limit_all_gathers() ? proto.limit_all_gathers() : true;
  s.use_orig_params = proto.use_orig_params();
  s.cpu_offload = proto.cpu_offload().offload_params();
  s.sync_module_states = proto.sync_module_states();
  const auto& mp = proto.mixed_precision();
  for (const auto& [field, value, target] :
       {std::tuple{"param_dtype", mp.param_dtype(), &s.param_dtype},
        std::tuple{"reduce_dtype", mp.reduce_dtype(), &s.reduce_dtype}}) {
    if (value == v1::DTYPE_UNSPECIFIED) continue;
    ASSIGN_OR_RETURN(DType dtype,
                     DTypeFromProto(value, DType::kFloat32,
                                    absl::StrCat("job.sharding.mixed_precision.", field)));
    if (!IsFloating(dtype)) {
      return Invalid(absl::StrCat("sharding.mixed_precision.", field),
                     absl::StrCat("must be a floating dtype, got ", DTypeName(dtype)));
    }
    *target = dtype;
  }
  return s;
}

absl::StatusOr<OptimizerSettings> OptimizerFromProto(const v1::Optimizer& proto) {
  OptimizerSettings o;
  if (!std::isfinite(proto.lr()) || proto.lr() < 0) {
    return Invalid("optimizer.lr", absl::StrCat("must be a finite number >= 0, got ", proto.lr()));
  }
  switch (proto.kind_case()) {
    case v1::Optimizer::kSgd: {
      o.kind = OptimizerKind::kSgd;
      const auto& p = proto.sgd();
      o.sgd = SgdOptions{proto.lr(),   p.momentum(),     p.dampening(),
                         p.nesterov(), p.weight_decay(), p.maximize()};
      RETURN_IF_ERROR(InField("optimizer.sgd", ValidateSgdOptions(o.sgd)));
      break;
    }
    case v1::Optimizer::kAdam:
    case v1::Optimizer::kAdamw:
    case v1::Optimizer::KIND_NOT_SET: {
      const bool adamw = proto.kind_case() != v1::Optimizer::kAdam;
      const v1::Optimizer::Adam& p = adamw ? proto.adamw() : proto.adam();
      o.kind = adamw ? OptimizerKind::kAdamW : OptimizerKind::kAdam;
      o.adam.lr = proto.lr();
      if (p.beta1() != 0 || p.beta2() != 0) {
        o.adam.beta1 = p.beta1();
        o.adam.beta2 = p.beta2();
      }
      if (p.eps() != 0) o.adam.eps = p.eps();
      o.adam.weight_decay = p.weight_decay();
      o.adam.amsgrad = p.amsgrad();
      o.adam.maximize = p.maximize();
      o.adam.decoupled_weight_decay = adamw;
      RETURN_IF_ERROR(
          InField(adamw ? "optimizer.adamw" : "optimizer.adam", ValidateAdamOptions(o.adam)));
      break;
    }
  }
  if (!std::isfinite(proto.max_grad_norm()) || proto.max_grad_norm() < 0) {
    return Invalid("optimizer.max_grad_norm",
                   absl::StrCat("must be >= 0 (0 disables clipping), got ", proto.max_grad_norm()));
  }
  o.max_grad_norm = proto.max_grad_norm();
  o.grad_norm_type = proto.grad_norm_type() == 0 ? 2.0 : proto.grad_norm_type();
  if (!(o.grad_norm_type > 0)) {
    return Invalid("optimizer.grad_norm_type",
                   absl::StrCat("must be > 0 or +inf, got ", o.grad_norm_type));
  }
  return o;
}

absl::StatusOr<RecoverySettings> RecoveryFromProto(const v1::RecoveryPolicy& proto,
                                                   int world_size) {
  constexpr int kMaxRestarts = 1000;
  constexpr double kMaxSpareWaitS = 3600;
  constexpr double kMaxMinWorldWaitS = 86400;  // a day: a node's repair, not a reboot
  RecoverySettings r;
  if (proto.has_max_restarts()) {
    if (proto.max_restarts() < 0 || proto.max_restarts() > kMaxRestarts) {
      return Invalid("recovery.max_restarts", absl::StrCat("must be between 0 and ", kMaxRestarts,
                                                           ", got ", proto.max_restarts()));
    }
    r.max_restarts = proto.max_restarts();
  }
  if (proto.has_min_world_size()) {
    if (proto.min_world_size() < 1 || proto.min_world_size() > world_size) {
      return Invalid("recovery.min_world_size",
                     absl::StrCat("must be between 1 and the world size ", world_size, ", got ",
                                  proto.min_world_size()));
    }
    r.min_world_size = proto.min_world_size();
  }
  if (proto.has_spare_wait_s()) {
    if (!std::isfinite(proto.spare_wait_s()) || proto.spare_wait_s() < 0 ||
        proto.spare_wait_s() > kMaxSpareWaitS) {
      return Invalid("recovery.spare_wait_s", absl::StrCat("must be between 0 and ", kMaxSpareWaitS,
                                                           " seconds, got ", proto.spare_wait_s()));
    }
    r.spare_wait_s = proto.spare_wait_s();
  }
  if (proto.has_min_world_wait_s()) {
    if (!std::isfinite(proto.min_world_wait_s()) || proto.min_world_wait_s() < 0 ||
        proto.min_world_wait_s() > kMaxMinWorldWaitS) {
      return Invalid("recovery.min_world_wait_s",
                     absl::StrCat("must be between 0 and ", kMaxMinWorldWaitS, " seconds, got ",
                                  proto.min_world_wait_s()));
    }
    r.min_world_wait_s = proto.min_world_wait_s();
  }
  return r;
}

absl::StatusOr<CheckpointSettings> CheckpointsFromProto(const v1::CheckpointSchedule& proto) {
  CheckpointSettings c;
  if (proto.every_steps() < 0) {
    return Invalid("checkpoints.every_steps",
                   absl::StrCat("must be >= 0 (0: only on demand), got ", proto.every_steps()));
  }
  if (proto.keep_last() < 0) {
    return Invalid("checkpoints.keep_last",
                   absl::StrCat("must be >= 0 (0: keep all), got ", proto.keep_last()));
  }
  if (proto.in_memory_every_steps() < 0) {
    return Invalid("checkpoints.in_memory_every_steps",
                   absl::StrCat("must be >= 0 (0: no in-memory peer snapshots), got ",
                                proto.in_memory_every_steps()));
  }
  c.in_memory_every_steps = proto.in_memory_every_steps();
  return c;
}

absl::StatusOr<DataSettings> DataFromProto(const v1::DataSpec& proto, int world_size) {
  DataSettings d;
  switch (proto.kind()) {
    case v1::DataSpec::KIND_UNSPECIFIED:
    case v1::DataSpec::TEACHER_STUDENT_REGRESSION:
      d.kind = "regression";
      break;
    case v1::DataSpec::CLASSIFICATION:
      d.kind = "classification";
      break;
    case v1::DataSpec::TOKEN_SEQUENCES:
      d.kind = "tokens";
      break;
    case v1::DataSpec::FILE:
      d.kind = "npy";
      if (proto.path().empty()) return Invalid("data.path", "is required for FILE data");
      if (proto.path().find("..") != std::string::npos || proto.path().front() == '/') {
        return Invalid("data.path", absl::StrCat("must be relative to the worker's data "
                                                 "directory without '..', got '",
                                                 proto.path(), "'"));
      }
      break;
    default:
      return Invalid("data.kind",
                     absl::StrCat("has unknown value ", static_cast<int>(proto.kind())));
  }
  if (proto.global_batch_size() <= 0) {
    return Invalid("data.global_batch_size",
                   absl::StrCat("must be > 0, got ", proto.global_batch_size()));
  }
  if (proto.global_batch_size() % world_size != 0) {
    return Invalid("data.global_batch_size",
                   absl::StrCat(proto.global_batch_size(), " is not divisible by the world size ",
                                world_size));
  }
  if (proto.sequence_length() < 0) {
    return Invalid("data.sequence_length",
                   absl::StrCat("must be >= 0, got ", proto.sequence_length()));
  }
  d.global_batch_size = proto.global_batch_size();
  d.sequence_length = proto.sequence_length() == 0 ? 1 : proto.sequence_length();
  d.seed = proto.seed();
  d.path = proto.path();
  return d;
}

}  // namespace

absl::StatusOr<JobConfig> JobConfigFromProto(const v1::JobSpec& spec) {
  JobConfig job;
  if (!ValidName(spec.name())) {
    return Invalid("name", absl::StrCat("must be 1-128 characters of letters, digits, '-', '_' "
                                        "or '.', got '",
                                        spec.name(), "'"));
  }
  job.name = spec.name();
  if (spec.world_size() < 1 || spec.world_size() > kMaxWorldSize) {
    return Invalid("world_size", absl::StrCat("must be between 1 and ", kMaxWorldSize, ", got ",
                                              spec.world_size()));
  }
  job.world_size = spec.world_size();
  if (!spec.has_model() || !spec.model().has_root()) {
    return Invalid("model", "is required (a module tree with at least one parameter)");
  }
  absl::StatusOr<ModelSpec> model = ModelSpecFromProto(spec.model());
  if (!model.ok()) return InField("model", model.status());
  job.model = *std::move(model);
  ASSIGN_OR_RETURN(job.wrap_policy, WrapPolicyFromProto(spec.wrap_policy()));
  ASSIGN_OR_RETURN(job.sharding, ShardingFromProto(spec.sharding(), job.world_size));
  ASSIGN_OR_RETURN(job.optimizer, OptimizerFromProto(spec.optimizer()));
  ASSIGN_OR_RETURN(job.data, DataFromProto(spec.data(), job.world_size));
  job.seed = spec.seed();
  ASSIGN_OR_RETURN(job.recovery, RecoveryFromProto(spec.recovery(), job.world_size));
  ASSIGN_OR_RETURN(job.checkpoints, CheckpointsFromProto(spec.checkpoints()));
  // Ranks given explicitly must name every rank exactly once: a duplicate or a
  // gap would leave the job waiting for a worker that can never be assigned.
  std::map<int, std::string> worker_by_rank;
  for (const auto& [worker, rank] : spec.rank_by_worker_id()) {
    if (worker.empty()) return Invalid("rank_by_worker_id", "has an empty worker id");
    if (rank < 0 || rank >= job.world_size) {
      return Invalid(absl::StrCat("rank_by_worker_id[", worker, "]"),
                     absl::StrCat("rank ", rank, " is outside [0, ", job.world_size, ")"));
    }
    auto [it, inserted] = worker_by_rank.emplace(rank, worker);
    if (!inserted) {
      const auto& [first, second] = std::minmax(it->second, worker);
      return Invalid("rank_by_worker_id",
                     absl::StrCat("gives rank ", rank, " to both ", first, " and ", second));
    }
    job.rank_by_worker_id[worker] = rank;
  }
  if (!worker_by_rank.empty() && static_cast<int>(worker_by_rank.size()) != job.world_size) {
    std::vector<int> missing;
    for (int r = 0; r < job.world_size; ++r) {
      if (!worker_by_rank.contains(r)) missing.push_back(r);
    }
    return Invalid("rank_by_worker_id",
                   absl::StrCat("names ", worker_by_rank.size(), " of the ", job.world_size,
                                " ranks; missing rank(s) ", absl::StrJoin(missing, ", "),
                                " (name every rank, or leave it out for registration order)"));
  }
  // The whole layout must exist for this world size: units, dtypes, ties.
  if (absl::Status s =
          ComputePlan(job.model, job.wrap_policy, job.world_size, job.sharding, job.optimizer)
              .status();
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("job: ", s.message()));
  }
  return job;
}

absl::StatusOr<std::vector<Unit>> JobUnits(const JobConfig& job) {
  ASSIGN_OR_RETURN(ModelIndex index, IndexModel(job.model));
  return ComputeUnits(index, job.wrap_policy);
}

v1::Unit UnitToProto(const Unit& unit) {
  v1::Unit proto;
  proto.set_index(unit.index);
  proto.set_module_fqn(unit.module_fqn);
  for (const UnitParam& param : unit.params) proto.add_param_fqns(param.fqn);
  for (const SharedParam& shared : unit.shared) proto.add_shared_param_fqns(shared.fqn);
  proto.set_numel(unit.numel);
  return proto;
}

}  // namespace flatshard
