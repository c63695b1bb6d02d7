#include "client/plan_printer.h"

#include <iomanip>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace flatshard {
namespace {

std::string ModuleName(const std::string& fqn) { return fqn.empty() ? "(root)" : fqn; }

}  // namespace

std::string HumanBytes(int64_t bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 4) {
    value /= 1024.0;
    ++unit;
  }
  return unit == 0 ? absl::StrCat(bytes, " B") : absl::StrFormat("%.2f %s", value, kUnits[unit]);
}

void PrintPlan(const Plan& plan, std::ostream& out) {
  out << "model " << (plan.model_name.empty() ? "(unnamed)" : plan.model_name) << ": "
      << plan.total_params << " parameters in " << plan.units.size() << " units\n";
  out << "strategy " << ShardingStrategyName(plan.effective_strategy);
  if (plan.effective_strategy != plan.sharding.strategy) {
    out << " (asked " << ShardingStrategyName(plan.sharding.strategy) << ")";
  }
  out << " over " << plan.ranks.world_size << " ranks";
  if (IsHybrid(plan.effective_strategy)) {
    out << " = " << plan.ranks.replicas << " replicas x " << plan.ranks.shard_size
        << " shard ranks";
  }
  out << " | policy " << plan.policy << " | use_orig_params "
      << (plan.sharding.use_orig_params ? "true" : "false") << "\n";
  out << "precision: param " << DTypeName(plan.precision.param_dtype) << ", reduce "
      << DTypeName(plan.precision.reduce_dtype) << " | gradient divide: pre " << plan.divide.pre
      << ", post " << plan.divide.post << "\n";
  for (const std::string& warning : plan.warnings) out << "warning: " << warning << "\n";

  out << "\nUNITS\n";
  out << absl::StrFormat("%-5s %-28s %-20s %12s %12s %10s %10s %10s\n", "unit", "module", "type",
                         "numel", "flat N", "shard S", "pad(flat)", "pad(S*W)");
  for (const UnitPlan& u : plan.units) {
    const FlatParamLayout& l = u.layout;
    out << absl::StrFormat("%-5d %-28s %-20s %12d %12d %10d %10d %10d\n", u.unit.index,
                           ModuleName(u.unit.module_fqn), u.unit.module_type, u.unit.numel,
                           l.unpadded_unsharded_numel(), l.sharded_numel(),
                           l.unpadded_unsharded_numel() - l.param_numel(),
                           l.padded_unsharded_numel() - l.unpadded_unsharded_numel());
    for (size_t i = 0; i < u.unit.params.size(); ++i) {
      const UnitParam& p = u.unit.params[i];
      out << absl::StrFormat("        %-44s [%s] numel %d flat [%d, %d]\n", p.fqn,
                             absl::StrJoin(p.shape, ", "), p.numel, l.param_ranges()[i].start,
                             l.param_ranges()[i].end);
    }
    for (const SharedParam& s : u.unit.shared) {
      out << "        " << s.fqn << " -> tied to " << s.primary_fqn << "\n";
    }
  }

  out << "\nSHARDS (inclusive flat ranges; slices are param[intra_start..intra_end] @ "
         "offset_in_shard)\n";
  for (const UnitPlan& u : plan.units) {
    out << "unit " << u.unit.index << " " << ModuleName(u.unit.module_fqn) << "\n";
    for (const ShardInfo& shard : u.shards) {
      out << absl::StrFormat("  rank %-3d [%d, %d] pad %d:", shard.rank, shard.range.start,
                             shard.range.end, shard.numel_padded);
      bool any = false;
      for (size_t i = 0; i < shard.params.size(); ++i) {
        const ShardParamInfo& p = shard.params[i];
        if (!p.in_shard) continue;
        out << " " << u.unit.params[i].fqn << "[" << p.intra_param_start_idx << ".."
            << p.intra_param_end_idx << "]@" << p.offset_in_shard;
        any = true;
      }
      if (!any) out << " (padding only)";
      out << "\n";
    }
  }
  if (IsHybrid(plan.effective_strategy)) {
    out << "  (shard rank s on replica k is global rank k*" << plan.ranks.shard_size << " + s)\n";
  }

  const MemoryPlan& m = plan.memory_per_rank;
  out << "\nMEMORY PER RANK (every rank allocates the same)\n";
  out << "  sharded params      " << HumanBytes(m.sharded_param_bytes) << "\n";
  out << "  sharded grads       " << HumanBytes(m.grad_bytes) << "\n";
  out << "  optimizer state     " << HumanBytes(m.optimizer_state_bytes) << " ("
      << PlanOptimizerName(plan.optimizer) << ")\n";
  if (m.low_precision_shard_bytes > 0) {
    out << "  low-precision shard " << HumanBytes(m.low_precision_shard_bytes) << " (transient)\n";
  }
  out << "  peak unsharded      " << HumanBytes(m.peak_unsharded_bytes)
      << " with limit_all_gathers, " << HumanBytes(m.peak_unsharded_bytes_no_limit) << " without\n";
  out << "  total               " << HumanBytes(m.total_bytes) << "\n";

  out << "\nCOLLECTIVES PER STEP (bytes per call; wire = bytes each rank sends, ring)\n";
  out << absl::StrFormat("  %-15s %-5s %-10s %6s %6s %-9s %12s %12s\n", "op", "unit", "group",
                         "size", "count", "dtype", "bytes", "wire/rank");
  std::map<std::string, std::pair<int64_t, int64_t>> totals;
  for (const CollectivePlan& c : plan.collectives) {
    out << absl::StrFormat("  %-15s %-5d %-10s %6d %6d %-9s %12s %12s\n", c.op, c.unit, c.group,
                           c.group_size, c.count, DTypeName(c.dtype), HumanBytes(c.bytes),
                           HumanBytes(c.wire_bytes_per_rank));
    totals[c.op].first += c.count * c.bytes;
    totals[c.op].second += c.count * c.wire_bytes_per_rank;
  }
  for (const auto& [op, t] : totals) {
    out << "  total " << op << ": " << HumanBytes(t.first) << " moved, " << HumanBytes(t.second)
        << " sent per rank\n";
  }
}

}  // namespace flatshard
