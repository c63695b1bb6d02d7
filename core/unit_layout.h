// Every unit's FlatParameter layout and dtypes for a job (docs/fsdp-semantics.md
// §1, §4.2). The plan reports these layouts and every worker builds its units
// from them, so the coordinator's view of a shard and the worker's are the same
// computation, not two copies that must be kept in step.
#ifndef FLATSHARD_CORE_UNIT_LAYOUT_H_
#define FLATSHARD_CORE_UNIT_LAYOUT_H_

#include <vector>

#include "absl/status/statusor.h"

#include "core/flat_param_layout.h"
#include "core/sharding.h"
#include "core/wrap_policy.h"

namespace flatshard {

struct UnitLayout {
  FlatParamLayout layout;
  ResolvedPrecision precision;
};

// One entry per unit of `units` (ComputeUnits' output), in the same order.
// Units are sharded over `ranks.shard_size` ranks unless the effective
// strategy for `ranks.world_size` is NO_SHARD; param mixed precision sets the
// alignment dtype. Errors name the unit (FlatParamLayout::Create's checks).
absl::StatusOr<std::vector<UnitLayout>> ComputeUnitLayouts(const std::vector<Unit>& units,
                                                           const ShardingSettings& sharding,
                                                           const RankLayout& ranks);

}  // namespace flatshard

#endif  // FLATSHARD_CORE_UNIT_LAYOUT_H_
