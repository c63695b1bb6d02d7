#include "core/plan.h"

#include <algorithm>
#include <functional>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

#include "core/status_macros.h"
#include "core/unit_layout.h"

namespace flatshard {
namespace {

constexpr int kMaxWorldSize = 65536;

int64_t Bytes(int64_t numel, DType dtype) { return numel * static_cast<int64_t>(DTypeSize(dtype)); }

int64_t RingWireBytes(const std::string& op, int64_t bytes, int n) {
  if (n <= 1) return 0;
  const int64_t share = bytes / n * (n - 1) + (bytes % n) * (n - 1) / n;
  return op == "all_reduce" ? 2 * share : share;
}

void AddCollective(Plan& plan, std::string op, int unit, std::string group, int group_size,
                   int count, DType dtype, int64_t numel) {
  CollectivePlan c;
  c.op = std::move(op);
  c.unit = unit;
  c.group = std::move(group);
  c.group_size = group_size;
  c.count = count;
  c.dtype = dtype;
  c.bytes = Bytes(numel, dtype);
  c.wire_bytes_per_rank = RingWireBytes(c.op, c.bytes, group_size);
  plan.collectives.push_back(std::move(c));
}

void PlanCollectives(Plan& plan) {
  const ShardingStrategy s = plan.effective_strategy;
  const DType param = plan.precision.param_dtype;
  const DType reduce = plan.precision.reduce_dtype;
  for (const UnitPlan& u : plan.units) {
    const int index = u.unit.index;
    if (s == ShardingStrategy::kNoShard) {
      AddCollective(plan, "all_reduce", index, "world", plan.ranks.world_size, 1, reduce,
                    u.layout.unpadded_unsharded_numel());
      continue;
    }
    // Forward all-gather, and a second one before backward when the unit was
    // freed after forward (docs/fsdp-semantics.md §2.5; the root never is).
    const int gathers = ReshardAfterForward(s, u.unit.is_root) ? 2 : 1;
    const int64_t unsharded = u.layout.padded_unsharded_numel();
    const bool hybrid = IsHybrid(s);
    AddCollective(plan, "all_gather", index, hybrid ? "shard" : "world", plan.ranks.shard_size,
                  gathers, param, unsharded);
    AddCollective(plan, "reduce_scatter", index, hybrid ? "shard" : "world", plan.ranks.shard_size,
                  1, reduce, unsharded);
    if (hybrid && plan.ranks.replicas > 1) {
      AddCollective(plan, "all_reduce", index, "replicate", plan.ranks.replicas, 1, reduce,
                    u.layout.sharded_numel());
    }
  }
}

void PlanMemory(Plan& plan) {
  MemoryPlan& m = plan.memory_per_rank;
  const int states = OptimizerStatesPerElement(plan.optimizer);
  std::vector<int64_t> non_root_unsharded;
  int64_t root_unsharded = 0;
  int64_t all_unsharded = 0;
  for (const UnitPlan& u : plan.units) {
    const DType dtype = u.layout.dtype();
    const int64_t s = u.layout.sharded_numel();
    m.sharded_param_bytes += Bytes(s, dtype);
    m.grad_bytes += Bytes(s, dtype);
    m.optimizer_state_bytes += states * Bytes(s, dtype);
    if (plan.precision.uses_param_mixed_precision) {
      m.low_precision_shard_bytes =
          std::max(m.low_precision_shard_bytes, Bytes(s, plan.precision.param_dtype));
    }
    if (!IsSharded(plan.effective_strategy)) continue;
    const int64_t unsharded = Bytes(u.layout.padded_unsharded_numel(), plan.precision.param_dtype);
    all_unsharded += unsharded;
    if (u.unit.is_root) {
      root_unsharded = unsharded;
    } else {
      non_root_unsharded.push_back(unsharded);
    }
  }
  if (IsSharded(plan.effective_strategy)) {
    // Without the limiter the CPU can issue every all-gather before the first
    // buffer is freed. With it (docs/fsdp-semantics.md §9.3) at most two freed-after-forward
    // units are live beside the root, which stays unsharded until backward ends.
    // ZeRO-2 strategies never free after forward, so all units are live then.
    m.peak_unsharded_bytes_no_limit = all_unsharded;
    if (ReshardAfterForward(plan.effective_strategy, /*is_root=*/false)) {
      std::sort(non_root_unsharded.rbegin(), non_root_unsharded.rend());
      int64_t top_two = 0;
      for (size_t i = 0; i < std::min<size_t>(2, non_root_unsharded.size()); ++i) {
        top_two += non_root_unsharded[i];
      }
      m.peak_unsharded_bytes = root_unsharded + top_two;
    } else {
      m.peak_unsharded_bytes = all_unsharded;
    }
  }
  m.total_bytes =
      m.sharded_param_bytes + m.grad_bytes + m.optimizer_state_bytes + m.low_precision_shard_bytes +
      (plan.sharding.limit_all_gathers ? m.peak_unsharded_bytes : m.peak_unsharded_bytes_no_limit);
}

}  // namespace

std::string PlanOptimizerName(const OptimizerSettings& optimizer) {
  if (optimizer.kind == OptimizerKind::kSgd && optimizer.sgd.momentum != 0.0) {
    return "sgd-momentum";
  }
  return std::string(OptimizerKindName(optimizer.kind));
}

absl::StatusOr<Plan> ComputePlan(const ModelSpec& spec, const WrapPolicy& policy, int world_size,
                                 const ShardingSettings& sharding,
                                 const OptimizerSettings& optimizer) {
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("world_size must be between 1 and ", kMaxWorldSize, ", got ", world_size));
  }
  for (const auto& [name, dtype] : {std::pair{"param_dtype", sharding.param_dtype},
                                    std::pair{"reduce_dtype", sharding.reduce_dtype}}) {
    if (dtype.has_value() && !IsFloating(*dtype)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "mixed_precision.", name, " must be a floating dtype, got ", DTypeName(*dtype)));
    }
  }
  Plan plan;
  plan.model_name = spec.name;
  plan.policy = WrapPolicyToString(policy);
  plan.world_size = world_size;
  plan.sharding = sharding;
  plan.optimizer = optimizer;
  plan.effective_strategy = EffectiveStrategy(sharding.strategy, world_size);
  if (plan.effective_strategy != sharding.strategy) {
    plan.warnings.push_back(absl::StrCat("world_size 1: ", ShardingStrategyName(sharding.strategy),
                                         " runs as NO_SHARD"));
  }
  ASSIGN_OR_RETURN(plan.ranks, ComputeRankLayout(sharding.strategy, world_size,
                                                 sharding.hybrid_shard_group_size));
  ASSIGN_OR_RETURN(ModelIndex index, IndexModel(spec));
  ASSIGN_OR_RETURN(std::vector<Unit> units, ComputeUnits(index, policy));
  for (const std::string& type : policy.module_types) {
    bool used = false;
    for (const IndexedModule& m : index.modules) used = used || m.type == type;
    if (!used) {
      plan.warnings.push_back(
          absl::StrCat("wrap policy type '", type, "' matches no module of the model"));
    }
  }
  plan.total_params = index.TotalNumel();
  plan.divide = ComputeGradientDivideFactors(
      IsHybrid(plan.effective_strategy) ? plan.ranks.world_size : plan.ranks.shard_size);
  ASSIGN_OR_RETURN(std::vector<UnitLayout> layouts,
                   ComputeUnitLayouts(units, sharding, plan.ranks));
  const int shard_ranks = IsSharded(plan.effective_strategy) ? plan.ranks.shard_size : 1;
  for (size_t u = 0; u < units.size(); ++u) {
    plan.precision = layouts[u].precision;
    UnitPlan unit{std::move(units[u]), std::move(layouts[u].layout), {}};
    for (int r = 0; r < shard_ranks; ++r) unit.shards.push_back(unit.layout.ComputeShardInfo(r));
    plan.units.push_back(std::move(unit));
  }
  PlanCollectives(plan);
  PlanMemory(plan);
  return plan;
}

std::string PlanToJson(const Plan& plan, int indent) {
  using nlohmann::json;
  auto dtype_or_null = [](const std::optional<DType>& d) -> json {
    return d.has_value() ? json(std::string(DTypeName(*d))) : json(nullptr);
  };
  json j;
  j["format"] = "flatshard.plan/v1";
  j["model"] = plan.model_name;
  j["total_params"] = plan.total_params;
  j["config"] = {
      {"world_size", plan.world_size},
      {"strategy", std::string(ShardingStrategyName(plan.sharding.strategy))},
      {"effective_strategy", std::string(ShardingStrategyName(plan.effective_strategy))},
      {"hybrid_shard_group_size", plan.sharding.hybrid_shard_group_size},
      {"wrap_policy", plan.policy},
      {"use_orig_params", plan.sharding.use_orig_params},
      {"param_dtype", dtype_or_null(plan.sharding.param_dtype)},
      {"reduce_dtype", dtype_or_null(plan.sharding.reduce_dtype)},
      {"optimizer", PlanOptimizerName(plan.optimizer)},
      {"amsgrad", plan.optimizer.adam.amsgrad},
      {"limit_all_gathers", plan.sharding.limit_all_gathers},
  };
  j["ranks"] = {{"world_size", plan.ranks.world_size},
                {"shard_group_size", plan.ranks.shard_size},
                {"replicas", plan.ranks.replicas},
                {"shard_groups", plan.ranks.AllShardGroups()},
                {"replicate_groups", plan.ranks.AllReplicateGroups()}};
  j["precision"] = {{"param_dtype", std::string(DTypeName(plan.precision.param_dtype))},
                    {"reduce_dtype", std::string(DTypeName(plan.precision.reduce_dtype))}};
  j["gradient_divide"] = {{"pre", plan.divide.pre}, {"post", plan.divide.post}};
  json units = json::array();
  for (const UnitPlan& u : plan.units) {
    const FlatParamLayout& layout = u.layout;
    json params = json::array();
    for (size_t i = 0; i < u.unit.params.size(); ++i) {
      const UnitParam& p = u.unit.params[i];
      params.push_back(
          {{"fqn", p.fqn},
           {"shape", p.shape},
           {"numel", p.numel},
           {"dtype", std::string(DTypeName(p.dtype))},
           {"requires_grad", p.requires_grad},
           {"flat_range", {layout.param_ranges()[i].start, layout.param_ranges()[i].end}}});
    }
    json shared = json::array();
    for (const SharedParam& s : u.unit.shared) {
      shared.push_back({{"fqn", s.fqn}, {"primary", s.primary_fqn}});
    }
    json shards = json::array();
    for (const ShardInfo& shard : u.shards) {
      json slices = json::array();
      for (size_t i = 0; i < shard.params.size(); ++i) {
        const ShardParamInfo& p = shard.params[i];
        if (!p.in_shard) continue;
        slices.push_back({{"fqn", u.unit.params[i].fqn},
                          {"offset_in_shard", p.offset_in_shard},
                          {"numel_in_shard", p.numel_in_shard},
                          {"intra_param_start_idx", p.intra_param_start_idx},
                          {"intra_param_end_idx", p.intra_param_end_idx}});
      }
      shards.push_back({{"shard_rank", shard.rank},
                        {"start", shard.range.start},
                        {"end", shard.range.end},
                        {"numel_padded", shard.numel_padded},
                        {"params", std::move(slices)}});
    }
    units.push_back({{"index", u.unit.index},
                     {"module_fqn", u.unit.module_fqn},
                     {"module_type", u.unit.module_type},
                     {"is_root", u.unit.is_root},
                     {"numel", u.unit.numel},
                     {"dtype", std::string(DTypeName(layout.dtype()))},
                     {"numels_with_padding", layout.numels_with_padding()},
                     {"is_padding_mask", layout.is_padding_mask()},
                     {"unpadded_unsharded_numel", layout.unpadded_unsharded_numel()},
                     {"padding_in_flat", layout.unpadded_unsharded_numel() - layout.param_numel()},
                     {"sharded_numel", layout.sharded_numel()},
                     {"padded_unsharded_numel", layout.padded_unsharded_numel()},
                     {"params", std::move(params)},
                     {"shared_params", std::move(shared)},
                     {"shards", std::move(shards)}});
  }
  j["units"] = std::move(units);
  const MemoryPlan& m = plan.memory_per_rank;
  j["memory_per_rank"] = {{"sharded_param_bytes", m.sharded_param_bytes},
                          {"low_precision_shard_bytes", m.low_precision_shard_bytes},
                          {"grad_bytes", m.grad_bytes},
                          {"optimizer_state_bytes", m.optimizer_state_bytes},
                          {"peak_unsharded_bytes", m.peak_unsharded_bytes},
                          {"peak_unsharded_bytes_no_limit", m.peak_unsharded_bytes_no_limit},
                          {"total_bytes", m.total_bytes}};
  json collectives = json::array();
  std::map<std::string, std::pair<int64_t, int64_t>> totals;
  for (const CollectivePlan& c : plan.collectives) {
    collectives.push_back({{"op", c.op},
                           {"unit", c.unit},
                           {"group", c.group},
                           {"group_size", c.group_size},
                           {"count", c.count},
                           {"dtype", std::string(DTypeName(c.dtype))},
                           {"bytes", c.bytes},
                           {"wire_bytes_per_rank", c.wire_bytes_per_rank}});
    totals[c.op].first += c.count * c.bytes;
    totals[c.op].second += c.count * c.wire_bytes_per_rank;
  }
  j["collectives_per_step"] = std::move(collectives);
  json by_op = json::object();
  for (const auto& [op, t] : totals) {
    by_op[op] = {{"bytes", t.first}, {"wire_bytes_per_rank", t.second}};
  }
  j["collective_totals_per_step"] = std::move(by_op);
  j["warnings"] = plan.warnings;
  return j.dump(indent);
}

}  // namespace flatshard
