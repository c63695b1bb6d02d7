#include "core/unit_layout.h"

#include <utility>

#include "core/status_macros.h"

namespace flatshard {

absl::StatusOr<std::vector<UnitLayout>> ComputeUnitLayouts(const std::vector<Unit>& units,
                                                           const ShardingSettings& sharding,
                                                           const RankLayout& ranks) {
  const ShardingStrategy strategy = EffectiveStrategy(sharding.strategy, ranks.world_size);
  std::vector<UnitLayout> layouts;
  layouts.reserve(units.size());
  for (const Unit& unit : units) {
    std::vector<FlatParamEntry> entries;
    entries.reserve(unit.params.size());
    for (const UnitParam& p : unit.params) {
      entries.push_back(FlatParamEntry{p.fqn, p.shape, p.dtype, p.requires_grad});
    }
    // An empty unit has no dtype; Create refuses it with the unit's name.
    const DType dtype = entries.empty() ? DType::kFloat32 : entries.front().dtype;
    const ResolvedPrecision precision =
        ResolvePrecision(dtype, sharding.param_dtype, sharding.reduce_dtype);
    FlatParamLayoutOptions options;
    options.world_size = ranks.shard_size;
    options.sharded = IsSharded(strategy);
    options.use_orig_params = sharding.use_orig_params;
    options.has_compute_dtype = precision.uses_param_mixed_precision;
    options.compute_dtype = precision.param_dtype;
    ASSIGN_OR_RETURN(FlatParamLayout layout,
                     FlatParamLayout::Create(std::move(entries), options, UnitLabel(unit)));
    layouts.push_back(UnitLayout{std::move(layout), precision});
  }
  return layouts;
}

}  // namespace flatshard
